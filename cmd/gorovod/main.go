package main

import (
	"os"

	"github.com/gorovod/gorovod/cmd/gorovod/cli"
)

func main() { os.Exit(cli.Run(cli.Config{})) }
