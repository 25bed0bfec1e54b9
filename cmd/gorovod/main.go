// Command gorovod launches and measures gorovod jobs (the command line itself
// is package cli, so that a program with its own Go heuristics can run it).
//
//	gorovod run --np 2 --max-np 8 --heuristic scaling-efficiency -- ./trainer
//	gorovod bench allreduce --np 4 --min-bytes 4K --max-bytes 64M
package main

import (
	"os"

	"github.com/gorovod/gorovod/cli"
)

func main() { os.Exit(cli.Run(cli.Config{})) }
