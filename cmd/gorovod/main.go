// Command gorovod launches and measures gorovod jobs.
//
//	gorovod bench allreduce --np 4 --min-bytes 4K --max-bytes 64M
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `gorovod — elastic collective communication for distributed training

Usage:
  gorovod run [--np N] [--min-np N] [--max-np N] [--heuristic NAME] -- TRAINER [ARGS...]
      run an elastic training job: a driver plus N local workers; workers can
      be added (SIGUSR1 or by hand) and can leave or die while training goes on;
      with a heuristic, the job grows, shrinks and replaces stragglers by itself
  gorovod bench [allreduce|broadcast|allgather|reducescatter|alltoall] [flags]
      measure a collective across --np local worker processes over TCP loopback
  gorovod help

Run 'gorovod run --help' or 'gorovod bench --help' for the flags.
`

// errUsage marks a bad command line (exit status 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "gorovod:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "run":
		return runCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case benchWorkerCommand:
		return benchWorker(ctx, args[1:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "gorovod: unknown command %q\n\n%s", args[0], usage)
	return errUsage
}
