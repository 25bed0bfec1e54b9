// Command gorovod launches and measures gorovod jobs (the command line itself
// is package cli, so that a program with its own Go heuristics can run it).
//
//	gorovod run --np 2 --max-np 8 --heuristic scaling-efficiency -- ./trainer
//	gorovod bench allreduce --np 4 --min-bytes 4K --max-bytes 64M
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gorovod/gorovod/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cli.Main(ctx, os.Args[1:], cli.Config{})
	stop()
	switch {
	case err == nil:
	case errors.Is(err, cli.ErrUsage) || errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "gorovod:", err)
		os.Exit(1)
	}
}
