package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"golang.org/x/term"

	"github.com/gorovod/gorovod/cluster/pool"
	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/internal/logging"
)

// clusterCommand is `gorovod cluster JOBS.json`: several elastic jobs on a
// pool of local slots, shared by a scheduling policy, with a live table.
func clusterCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod cluster", flag.ContinueOnError)
	def := pool.DefaultConfig()
	slots := fs.Int("slots", 0, "worker slots in the pool (required): how many workers run at once")
	perNode := fs.Int("slots-per-node", 0, "slots that make one machine, for placement and the goodput models (default: all, one machine)")
	policy := fs.String("policy", "pollux", "scheduling policy: pollux, optimus or tiresias")
	interval := fs.Duration("interval", def.Interval, "time between scheduling rounds (a round also runs when a job arrives or ends)")
	penalty := fs.Duration("restart-penalty", def.RestartPenalty, "Pollux: what a resize costs a job (δ)")
	population := fs.Int("population", 0, "Pollux: genetic algorithm population (default 100)")
	generations := fs.Int("generations", 0, "Pollux: generations per round (default 100)")
	seed := fs.Uint64("seed", 1, "Pollux: random seed")
	threshold := fs.Duration("tiresias-threshold", 0, "Tiresias: slot time after which a job drops to the low-priority queue (default 16h, as in Pollux's study)")
	asJSON := fs.Bool("json", false, "print one JSON object per round, and the result, instead of the table")
	logOpts := logging.DefaultOptions()
	logOpts.Register(fs)
	usage := `Usage: gorovod cluster --slots N [flags] JOBS.json

Runs several elastic training jobs on a pool of N local worker slots and
shares the slots among them with a scheduling policy: every interval it fits
each job's goodput model to what the job measured (throughput at each size it
ran, gradient statistics when the trainer reports them), asks the policy for
an allocation and grows or shrinks the jobs through their drivers. It prints
a table of the jobs, their allocations, throughput and predicted goodput after
every round, and the completion times at the end.

JOBS.json is a JSON array of jobs:
  [{"name": "a", "argv": ["./synthetic", "--steps", "500"], "max_workers": 4},
   {"name": "b", "argv": ["./fashion-mnist", "--epochs", "1"], "submit": "30s"}]
with optional fields env, workers (the size asked for: Tiresias runs it),
min_workers, max_workers, submit (arrival after the start), init_batch and
limits (max_batch, min_micro_batch, max_micro_batch, accumulation).`
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	usageErr := func(format string, args ...any) error {
		fmt.Fprintf(stderr, "gorovod cluster: "+format+"\nRun 'gorovod cluster --help' for the flags.\n", args...)
		return ErrUsage
	}
	if err := logOpts.Validate(); err != nil {
		return usageErr("%v", err)
	}
	log, _ := logOpts.Logger(stderr)
	if fs.NArg() != 1 {
		return usageErr("want one JOBS.json file, got %d arguments", fs.NArg())
	}
	if *slots < 1 {
		return usageErr("--slots must be at least 1")
	}
	cfg := def
	cfg.Slots, cfg.SlotsPerNode, cfg.Interval, cfg.RestartPenalty, cfg.Logger = *slots, *perNode, *interval, *penalty, log
	if *interval <= 0 || *penalty < 0 || *perNode < 0 {
		return usageErr("--interval must be positive, --restart-penalty and --slots-per-node not negative")
	}
	switch *policy {
	case "pollux":
		cfg.Policy = scheduler.NewPollux(scheduler.PolluxConfig{Population: *population, Generations: *generations,
			Seed: *seed, RestartPenalty: *penalty, NoRestartPenalty: *penalty == 0})
	case "optimus":
		cfg.Policy = scheduler.NewOptimus()
	case "tiresias":
		cfg.Policy = scheduler.NewTiresias(scheduler.TiresiasConfig{QueueThreshold: *threshold})
	default:
		return usageErr("unknown policy %q (want pollux, optimus or tiresias)", *policy)
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return &commandError{command: "cluster", err: err}
	}
	cfg.Jobs, err = pool.ReadJobs(f)
	f.Close()
	if err != nil {
		return &commandError{command: "cluster", err: fmt.Errorf("%s: %w", fs.Arg(0), err)}
	}

	table := &poolTable{w: stdout}
	if out, ok := stdout.(*os.File); ok && !*asJSON {
		table.redraw = term.IsTerminal(int(out.Fd()))
	}
	enc := json.NewEncoder(stdout)
	cfg.OnRound = func(r pool.Round) {
		if *asJSON {
			_ = enc.Encode(struct {
				Kind string `json:"kind"`
				pool.Round
			}{"round", r})
			return
		}
		table.show(r)
	}
	res, err := pool.Run(ctx, cfg)
	if *asJSON {
		_ = enc.Encode(struct {
			Kind string `json:"kind"`
			pool.Result
		}{"result", res})
	} else {
		printPoolResult(stdout, res)
	}
	if err != nil {
		return &commandError{command: "cluster", err: err}
	}
	for _, j := range res.Jobs {
		if j.State != pool.Done {
			return &commandError{command: "cluster", err: fmt.Errorf("job %s %s: %s", j.Name, j.State, j.Err)}
		}
	}
	return nil
}

// poolTable prints the pool's table after each round; on a terminal it
// redraws the previous one in place.
type poolTable struct {
	w      io.Writer
	redraw bool
	lines  int // lines of the previous table, to redraw over
}

func (t *poolTable) show(r pool.Round) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "[%7.1fs] round %d, %s, %d of %d slots allocated\n", r.Elapsed, r.Round, r.Policy, r.Used, r.Slots)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\tstate\tslots\tworkers\tstep\tthroughput\tgoodput\tprofiled\tresizes\t")
	for _, j := range r.Jobs {
		step := fmt.Sprint(j.Step)
		if j.TotalSteps > 0 {
			step = fmt.Sprintf("%d/%d", j.Step, j.TotalSteps)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t\n", j.Name, j.State, j.Allocated, j.Workers, step,
			orDash(j.Throughput), orDash(j.Goodput), j.Profiled, j.Resizes)
	}
	tw.Flush()
	if t.redraw && t.lines > 0 {
		fmt.Fprintf(t.w, "\x1b[%dA\x1b[J", t.lines)
	} else if t.lines > 0 {
		fmt.Fprintln(t.w)
	}
	t.lines = strings.Count(b.String(), "\n")
	_, _ = t.w.Write(b.Bytes())
}

func orDash(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func printPoolResult(w io.Writer, res pool.Result) {
	fmt.Fprintf(w, "\n%s on %d slots: %d rounds\n", res.Policy, res.Slots, res.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "job\tstate\tsubmitted (s)\tstarted (s)\tfinished (s)\tJCT (s)\tresizes\t")
	for _, j := range res.Jobs {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", j.Name, j.State, j.Submitted, j.Started, j.Finished, j.JCT, j.Resizes)
	}
	tw.Flush()
	fmt.Fprintf(w, "average JCT %.1f s, makespan %.1f s, slot utilization %.1f%%\n",
		res.AvgJCT, res.Makespan, 100*res.SlotUtilization)
	for _, j := range res.Jobs {
		if j.Err != "" {
			fmt.Fprintf(w, "%s: %s\n", j.Name, j.Err)
		}
	}
}
