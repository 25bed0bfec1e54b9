package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gorovod/gorovod/heuristics"
)

const usage = `gorovod — elastic collective communication for distributed training

Usage:
  gorovod run [--np N] [--min-np N] [--max-np N] [--heuristic NAME] -- TRAINER [ARGS...]
      run an elastic training job: a driver plus N local workers; workers can
      be added (SIGUSR1 or by hand) and can leave or die while training goes on;
      with a heuristic, the job grows, shrinks and replaces stragglers by itself;
      --timeline-filename, --metrics-addr and --report DIR let you watch it
  gorovod attach JOBFILE -- TRAINER [ARGS...]
      start a worker by hand in a running job, from the job file 'run' printed
  gorovod follow [-n N] JOBDIR
      show a job's workers' output and end from the job directory 'run'
      printed, also after 'run' died (its workers train on)
  gorovod bench [allreduce|broadcast|allgather|reducescatter|alltoall] [flags]
      measure a collective across --np local worker processes (shared memory
      between processes of one host by default; --transport picks another)
  gorovod report [--out DIR] RUN.jsonl
      plots (SVG, PNG) and an HTML summary of a run from its 'run --json' lines
  gorovod simulate [--policy pollux|optimus|tiresias|all] WORKLOAD.csv...
      replay a cluster workload against Pollux's traces under a scheduling policy
  gorovod cluster --slots N [--policy pollux|optimus|tiresias] JOBS.json
      run several elastic jobs on a pool of N local worker slots, shared by a
      scheduling policy that grows and shrinks them by their goodput
  gorovod scheduler [--policy pollux|optimus|tiresias] [--leader-elect]
      the scheduler service of a Kubernetes cluster: shares the nodes among
      the GorovodJobs (deploy/kubernetes/gorovod.yaml runs it)
  gorovod submit JOB.yaml | gorovod submit --name N --image I [flags] -- COMMAND...
  gorovod jobs [-n NAMESPACE | -A]
  gorovod logs [--worker N] [-f] JOB
  gorovod delete JOB...
      elastic jobs (GorovodJobs) on a Kubernetes cluster where the gorovod
      scheduler shares the nodes among them (docs/clusters.md)
  gorovod help | --version

Run 'gorovod COMMAND --help' (run, attach, follow, bench, simulate, cluster, report,
scheduler, submit, jobs, logs, delete)
for a command's flags; run, bench, simulate, cluster, report and scheduler take
--log-level and --log-format.
`

// ErrUsage marks a bad command line; Main has already said what is wrong
// (the gorovod command exits with status 2).
var ErrUsage = errors.New("usage")

// Config is what a program running the command line brings to it.
type Config struct {
	// Heuristics are the policies `gorovod run --heuristic NAME` and
	// --heuristic-config choose from; nil means the built-in ones
	// (heuristics.NewRegistry). A program adds its own Go heuristics to a
	// registry and passes it here.
	Heuristics *heuristics.Registry
	// Stdout and Stderr default to the process's.
	Stdout, Stderr io.Writer
	// Terminate delivers the SIGTERMs the program receives (Run sets it).
	// `run` answers the first by asking every worker to leave gracefully
	// (a job preempted as a whole: a Slurm time limit, an evicted driver
	// pod) and the next by stopping them at once; every other command
	// stops at the first. Nil: only ctx ends a command.
	Terminate <-chan os.Signal
}

// Main runs the gorovod command line: args are the arguments after the
// program name ("run", "bench", "report", "help", "--version"). It returns
// ErrUsage for a bad command line, after printing what is wrong, and
// flag.ErrHelp after printing the help a command was asked for.
//
// The bench command runs its workers by starting the program again, so a
// program calling Main must hand it every argument list it was started with.
func Main(ctx context.Context, args []string, cfg Config) error {
	if cfg.Heuristics == nil {
		cfg.Heuristics = heuristics.NewRegistry()
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	stdout, stderr := cfg.Stdout, cfg.Stderr
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if args[0] != "run" && cfg.Terminate != nil {
		go func() {
			select {
			case <-cfg.Terminate:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	switch args[0] {
	case "run":
		return runCommand(ctx, args[1:], cfg.Heuristics, cfg.Terminate, stdout, stderr)
	case "attach":
		return attachCommand(ctx, args[1:], stdout, stderr)
	case "follow":
		return followCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case "simulate":
		if err := simulateCommand(ctx, args[1:], stdout, stderr); err != nil {
			return &commandError{command: "simulate", err: err}
		}
		return nil
	case "cluster":
		return clusterCommand(ctx, args[1:], stdout, stderr)
	case "report":
		return reportCommand(ctx, args[1:], stdout, stderr)
	case "scheduler":
		return schedulerCommand(ctx, args[1:], stdout, stderr)
	case "submit":
		return submitCommand(ctx, args[1:], stdout, stderr)
	case "jobs":
		return jobsCommand(ctx, args[1:], stdout, stderr)
	case "logs":
		return logsCommand(ctx, args[1:], stdout, stderr)
	case "delete":
		return deleteCommand(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, Version())
		return nil
	case benchWorkerCommand:
		return benchWorker(ctx, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "gorovod: unknown command %q\n\n%s", args[0], usage)
	return ErrUsage
}

// exitStatus is Run's exit status for Main's error: 0 for none (or
// --help), 2 for a bad command line, 143 for a GorovodJob's driver that left
// its running job to a replacement (ErrDetached), 1 for any other.
func exitStatus(err error) int {
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	case errors.Is(err, ErrDetached):
		return exitDetached
	}
	return 1
}

// Run is the whole body of a main function: it runs the command line on the
// process's arguments until it ends or SIGINT arrives (SIGTERM: Config.Terminate), and returns
// the exit status: 0 (also after --help), 1 after printing the error, 2 for a
// bad command line.
//
//	func main() { os.Exit(cli.Run(cli.Config{Heuristics: registry})) }
func Run(cfg Config) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
	defer stop()
	terminate := make(chan os.Signal, 1)
	signal.Notify(terminate, syscall.SIGTERM)
	defer signal.Stop(terminate)
	cfg.Terminate = terminate
	err := Main(ctx, os.Args[1:], cfg)
	code := exitStatus(err)
	if code == 0 || code == 2 {
		return code
	}
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	prefix := filepath.Base(os.Args[0])
	var ce *commandError
	if errors.As(err, &ce) {
		prefix, err = prefix+" "+ce.command, ce.err
	}
	// Each line of the error is prefixed: a job's error lists each failed
	// worker on a line of its own (errors.Join), and a line without the
	// prefix reads as some other program's.
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(stderr, "%s: %s\n", prefix, line)
	}
	return code
}
