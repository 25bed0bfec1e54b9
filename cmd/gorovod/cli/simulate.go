package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/cluster/simulator"
	"github.com/gorovod/gorovod/internal/logging"
)

// simulateRun is one simulation the command runs: a workload under a policy.
type simulateRun struct {
	workload string
	policy   string
	result   *simulator.Result
	wall     time.Duration
	err      error
}

func simulateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod simulate", flag.ContinueOnError)
	def := simulator.DefaultConfig()
	policies := fs.String("policy", simulator.Pollux, "policies to run, comma-separated: pollux, optimus, tiresias, or all")
	traces := fs.String("traces", "", "directory of the model traces (default: traces/ beside the workload's directory)")
	nodes := fs.Int("nodes", def.Nodes, "nodes in the cluster")
	gpus := fs.Int("gpus-per-node", def.GPUsPerNode, "GPUs per node")
	interval := fs.Duration("interval", def.Interval, "scheduling interval")
	rescale := fs.Duration("rescale-cost", def.RescaleCost, "time a running job trains nothing when its allocation changes (0: free)")
	start := fs.Duration("start-cost", 0, "time a job that had no GPUs trains nothing once it gets some (default: the rescale cost)")
	joiner := fs.Duration("joiner-startup", 0, "model live resizing: a job that grows trains on the GPUs it keeps for this long while new workers start, then pauses for the rescale cost (0: every change is one pause)")
	elastic := fs.Bool("elastic", false, "carry each round's allocation out as the scheduler service does: jobs resize live, a running job keeps its minimum (min_replicas, default 1), a waiting one starts at it by shrinking running ones (default: Pollux's study, where a job not allocated is suspended)")
	endCost := fs.Duration("end-cost", 0, "time from a job's last step to its completion, its GPUs held (the trainer's and driver's exit)")
	penalty := fs.Duration("restart-penalty", -1, "Pollux's re-allocation penalty δ (default: the rescale cost)")
	population := fs.Int("population", def.Pollux.Population, "Pollux: genetic algorithm population")
	generations := fs.Int("generations", def.Pollux.Generations, "Pollux: generations per scheduling round")
	fairness := fs.Float64("fairness", def.Pollux.Fairness, "Pollux: exponent p of the power mean of speed-ups (negative: fairer)")
	seed := fs.Uint64("seed", def.Pollux.Seed, "Pollux: random seed")
	selection := fs.String("selection", "elitist", "Pollux: the genetic algorithm's selection, elitist (on the power mean) or nsga2 (Pollux's NSGA-II on power mean and cluster utility)")
	threshold := fs.Duration("tiresias-threshold", def.Tiresias.QueueThreshold, "Tiresias: GPU time after which a job drops to the low-priority queue")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "simulations run at once")
	asJSON := fs.Bool("json", false, "print one JSON object per simulation, with every job's result")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile (pprof) of the simulations to this file")
	logOpts := logging.DefaultOptions()
	logOpts.Register(fs)
	usage := `Usage: gorovod simulate [flags] WORKLOAD.csv...

Replays workloads (Pollux's format: name,time,application,num_replicas,batch_size,
and optionally epochs, max_replicas and min_replicas per job) against
per-model throughput and gradient-statistics traces under a scheduling
policy, and prints job completion times (JCT), makespan and GPU utilization.
With several workloads or policies, they run in parallel and a mean per
policy is added.

The traces of each application a workload names are in TRACES/<application>/:
placements.csv, scalability.csv and validation-<batch size>.csv, and, for a
model other than the six of Pollux's study (bert, cifar10, deepspeech2,
imagenet, ncf, yolov3), model.json: {"max_epochs": N, "max_local_bsz": 0,
"fixed_batch": 0, "max_replicas": 0} (docs/scheduler.md, "Your own models").`
	if err := parseFlags(fs, args, usage, stdout, stderr); err != nil {
		return err
	}
	if err := logOpts.Validate(); err != nil {
		return simulateUsageErr(stderr, "%v", err)
	}
	if fs.NArg() == 0 {
		return simulateUsageErr(stderr, "no workload given")
	}
	var names []string
	for _, p := range strings.Split(*policies, ",") {
		switch p = strings.TrimSpace(p); p {
		case "all":
			names = append(names, simulator.Pollux, simulator.Optimus, simulator.Tiresias)
		case simulator.Pollux, simulator.Optimus, simulator.Tiresias:
			names = append(names, p)
		default:
			return simulateUsageErr(stderr, "unknown policy %q (want pollux, optimus, tiresias or all)", p)
		}
	}
	switch {
	case *nodes < 1 || *gpus < 1 || *gpus > 9:
		return simulateUsageErr(stderr, "--nodes must be ≥ 1 and --gpus-per-node in [1, 9]")
	case *interval <= 0:
		return simulateUsageErr(stderr, "--interval must be positive")
	case *rescale < 0 || *start < 0 || *joiner < 0 || *endCost < 0:
		return simulateUsageErr(stderr, "--rescale-cost, --start-cost, --joiner-startup and --end-cost must not be negative")
	case *population < 2 || *generations < 1:
		return simulateUsageErr(stderr, "--population must be ≥ 2 and --generations ≥ 1")
	case *fairness == 0:
		return simulateUsageErr(stderr, "--fairness must not be 0")
	case *selection != "elitist" && *selection != "nsga2":
		return simulateUsageErr(stderr, "--selection must be elitist or nsga2")
	case *parallel < 1:
		return simulateUsageErr(stderr, "--parallel must be ≥ 1")
	}
	cfg := def
	cfg.Nodes, cfg.GPUsPerNode, cfg.Interval = *nodes, *gpus, *interval
	cfg.RescaleCost, cfg.NoRescaleCost = *rescale, *rescale == 0
	cfg.StartCost, cfg.JoinerStartup = *start, *joiner
	cfg.Elastic, cfg.EndCost = *elastic, *endCost
	cfg.Pollux.Population, cfg.Pollux.Generations = *population, *generations
	cfg.Pollux.Fairness, cfg.Pollux.Seed = *fairness, *seed
	if *selection == "nsga2" {
		cfg.Pollux.Selection = scheduler.NSGA2
	}
	cfg.Pollux.RestartPenalty, cfg.Pollux.NoRestartPenalty = 0, false
	if *penalty >= 0 {
		cfg.Pollux.RestartPenalty, cfg.Pollux.NoRestartPenalty = *penalty, *penalty == 0
	}
	cfg.Tiresias.QueueThreshold = *threshold

	// Each traces directory is loaded once, for the applications its
	// workloads name: a directory of one's own models need not hold
	// Pollux's six.
	workloads := map[string][]simulator.WorkloadJob{}
	traceDirOf := map[string]string{}
	var dirs []string
	appsIn := map[string][]string{}
	for _, path := range fs.Args() {
		w, err := simulator.ReadWorkloadFile(path)
		if err != nil {
			return err
		}
		workloads[path] = w
		dir := *traces
		if dir == "" {
			dir = filepath.Join(filepath.Dir(path), "..", "traces")
		}
		traceDirOf[path] = dir
		if _, seen := appsIn[dir]; !seen {
			dirs = append(dirs, dir)
		}
		appsIn[dir] = append(appsIn[dir], simulator.Applications(w)...)
	}
	modelsIn := map[string]map[string]simulator.ModelConfig{}
	tracesIn := map[string]map[string]*simulator.Trace{}
	for _, dir := range dirs {
		models, err := simulator.LoadModels(dir, appsIn[dir], simulator.DefaultModels())
		if err != nil {
			return fmt.Errorf("loading models (set --traces): %w", err)
		}
		t, err := simulator.LoadTraces(dir, models)
		if err != nil {
			return fmt.Errorf("loading traces (set --traces): %w", err)
		}
		modelsIn[dir], tracesIn[dir] = models, t
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	var runs []*simulateRun
	for _, p := range names {
		for _, path := range fs.Args() {
			runs = append(runs, &simulateRun{workload: path, policy: p})
		}
	}
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.err = ctx.Err()
				return
			}
			defer func() { <-sem }()
			c := cfg
			c.Policy = r.policy
			dir := traceDirOf[r.workload]
			c.Models = modelsIn[dir]
			start := time.Now()
			r.result, r.err = simulator.Simulate(ctx, c, workloads[r.workload], tracesIn[dir])
			r.wall = time.Since(start)
		}()
	}
	wg.Wait()
	for _, r := range runs {
		if r.err != nil {
			return fmt.Errorf("%s under %s: %w", r.workload, r.policy, r.err)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range runs {
			out := struct {
				Workload string  `json:"workload"`
				WallS    float64 `json:"wall_s"`
				*simulator.Result
			}{r.workload, r.wall.Seconds(), r.result}
			if err := enc.Encode(out); err != nil {
				return err
			}
		}
		return nil
	}
	printSimulation(stdout, runs, names, len(fs.Args()))
	return nil
}

func printSimulation(w io.Writer, runs []*simulateRun, policies []string, workloads int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tpolicy\tavg JCT (h)\tp50 (h)\tp99 (h)\tmax (h)\tmakespan (h)\tGPU util\trounds\twall (s)\t")
	h := func(s float64) string { return fmt.Sprintf("%.3f", s/3600) }
	for _, r := range runs {
		res := r.result
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%d\t%.1f\t\n", filepath.Base(r.workload), r.policy,
			h(res.AvgJCT), h(res.P50JCT), h(res.P99JCT), h(res.MaxJCT), h(res.Makespan), 100*res.Utilization, res.Rounds, r.wall.Seconds())
	}
	if workloads > 1 {
		for _, p := range policies {
			var avg, p99, makespan, util float64
			n := 0
			for _, r := range runs {
				if r.policy == p {
					avg += r.result.AvgJCT
					p99 += r.result.P99JCT
					makespan += r.result.Makespan
					util += r.result.Utilization
					n++
				}
			}
			k := float64(n)
			fmt.Fprintf(tw, "mean of %d\t%s\t%s\t\t%s\t\t%s\t%.1f%%\t\t\t\n", n, p, h(avg/k), h(p99/k), h(makespan/k), 100*util/k)
		}
	}
	tw.Flush()
	if len(policies) > 1 && workloads > 0 {
		mean := map[string]float64{}
		for _, r := range runs {
			mean[r.policy] += r.result.AvgJCT / float64(workloads)
		}
		for _, p := range policies[1:] {
			fmt.Fprintf(w, "average JCT of %s relative to %s: %.3f (%+.1f%%)\n", policies[0], p,
				mean[policies[0]]/mean[p], 100*(mean[policies[0]]/mean[p]-1))
		}
	}
}

func simulateUsageErr(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod simulate: "+format+"\n", args...)
	return ErrUsage
}
