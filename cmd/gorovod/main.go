package main

import (
	"os"

	"github.com/gorovod/gorovod/cli"
)

func main() { os.Exit(cli.Run(cli.Config{})) }
