package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	gsync "github.com/gorovod/gorovod/sync"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/gpu"
	"github.com/gorovod/gorovod/internal/launch"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/straggler"
)

// runOptions is `gorovod run`'s command line.
type runOptions struct {
	registry           *heuristics.Registry
	argv               []string
	np, minNP, maxNP   int
	verbose            bool
	heuristic          string
	heuristicOpts      stringList
	heuristicConfig    string
	replaceStragglers  bool
	stragglerThreshold float64
	stragglerWindow    int
	skipSteps          int
	totalSteps         int64
	asJSON             bool
	progress           string
	placement          string
}

// autoscaling says whether the engine acts (a heuristic, or straggler
// replacement, was asked for); otherwise it only measures.
func (o *runOptions) autoscaling() bool {
	return o.heuristic != "" || o.heuristicConfig != "" || o.replaceStragglers
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// runCommand is `gorovod run`: the driver of an elastic job, the local
// launcher of its workers, and its autoscaling engine.
func runCommand(ctx context.Context, args []string, registry *heuristics.Registry, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := runOptions{registry: registry}
	fs.IntVar(&o.np, "np", 2, "workers to start")
	fs.IntVar(&o.minNP, "min-np", 1, "fewest workers the job trains with; with fewer it waits for more")
	fs.IntVar(&o.maxNP, "max-np", 0, "most workers (0: no limit); SIGUSR1 adds one up to it")
	fs.BoolVar(&o.verbose, "v", false, "log the driver's decisions")
	fs.StringVar(&o.heuristic, "heuristic", "", "autoscaling policy by name (see --list-heuristics)")
	fs.Var(&o.heuristicOpts, "heuristic-opt", "a `key=value` parameter of the heuristic (repeatable)")
	fs.StringVar(&o.heuristicConfig, "heuristic-config", "", "a JSON `file` naming the heuristic and its parameters (compositions too)")
	listHeuristics := fs.Bool("list-heuristics", false, "list the heuristics and exit")
	fs.BoolVar(&o.replaceStragglers, "replace-stragglers", false, "replace workers that compute slower than the others (default on with a heuristic)")
	fs.Float64Var(&o.stragglerThreshold, "straggler-threshold", straggler.DefaultConfig().Threshold, "a worker whose throughput stays under this fraction of the median is a straggler")
	fs.IntVar(&o.stragglerWindow, "straggler-window", straggler.DefaultConfig().Sustain, "steps a straggler must stay under the threshold")
	fs.IntVar(&o.skipSteps, "skip-steps", heuristics.DefaultEngineConfig().Skip, "steps after each world change that are not measured")
	fs.Int64Var(&o.totalSteps, "total-steps", 0, "the job's length in steps, for policies weighing remaining work (default: as the trainer reports)")
	fs.BoolVar(&o.asJSON, "json", false, "print the autoscaling decisions and the summary as JSON lines on stdout")
	fs.StringVar(&o.progress, "progress", "auto", "progress bar: auto (when stderr is a terminal), always or never")
	fs.StringVar(&o.placement, "placement", string(launch.PlaceAnywhere), "pin workers to CPUs: none, or balanced (each worker to its share of the CPUs)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gorovod run [flags] -- TRAINER [ARGS...]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return ErrUsage
	}
	if *listHeuristics {
		r := o.registry
		for _, name := range r.Names() {
			fmt.Fprintf(stdout, "%-20s %s\n", name, r.Summary(name))
		}
		return nil
	}
	stragglersSet := false
	fs.Visit(func(f *flag.Flag) { stragglersSet = stragglersSet || f.Name == "replace-stragglers" })
	if !stragglersSet && (o.heuristic != "" || o.heuristicConfig != "") {
		o.replaceStragglers = true
	}
	o.argv = fs.Args()
	if len(o.argv) > 0 && o.argv[0] == "--" {
		o.argv = o.argv[1:]
	}
	switch {
	case len(o.argv) == 0:
		return runUsage(stderr, "no trainer command (gorovod run [flags] -- TRAINER ARGS...)")
	case o.np < 1:
		return runUsage(stderr, "--np %d must be at least 1", o.np)
	case o.minNP < 1 || o.minNP > o.np:
		return runUsage(stderr, "--min-np %d must be between 1 and --np %d", o.minNP, o.np)
	case o.maxNP != 0 && o.maxNP < o.np:
		return runUsage(stderr, "--max-np %d is below --np %d", o.maxNP, o.np)
	case o.heuristic != "" && o.heuristicConfig != "":
		return runUsage(stderr, "give --heuristic or --heuristic-config, not both")
	case len(o.heuristicOpts) > 0 && o.heuristic == "":
		return runUsage(stderr, "--heuristic-opt needs --heuristic")
	case o.progress != "auto" && o.progress != "always" && o.progress != "never":
		return runUsage(stderr, "--progress %q: want auto, always or never", o.progress)
	case o.skipSteps < 0 || o.totalSteps < 0 || o.stragglerWindow < 1:
		return runUsage(stderr, "--skip-steps and --total-steps must not be negative, --straggler-window must be positive")
	}
	if _, err := launch.ParsePlacement(o.placement); err != nil {
		return runUsage(stderr, "--placement: %v", err)
	}
	if _, err := exec.LookPath(o.argv[0]); err != nil {
		return runUsage(stderr, "trainer %q: %v", o.argv[0], err)
	}
	engCfg, err := o.engineConfig()
	if err != nil {
		return runUsage(stderr, "%v", err)
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return runJob(ctx, o, engCfg, log, stdout, stderr)
}

// engineConfig builds the autoscaling engine's configuration from the flags.
func (o *runOptions) engineConfig() (heuristics.EngineConfig, error) {
	cfg := heuristics.DefaultEngineConfig()
	cfg.MinWorkers, cfg.MaxWorkers, cfg.Skip, cfg.TotalSteps = o.minNP, o.maxNP, o.skipSteps, o.totalSteps
	cfg.ReplaceStragglers = o.replaceStragglers
	cfg.Straggler.Threshold, cfg.Straggler.Sustain = o.stragglerThreshold, o.stragglerWindow
	if err := cfg.Straggler.Validate(); err != nil {
		return cfg, err
	}
	var spec heuristics.Spec
	switch {
	case o.heuristicConfig != "":
		b, err := os.ReadFile(o.heuristicConfig)
		if err != nil {
			return cfg, err
		}
		if spec, err = heuristics.ParseSpec(b); err != nil {
			return cfg, fmt.Errorf("%s: %w", o.heuristicConfig, err)
		}
	case o.heuristic != "":
		var err error
		if spec, err = heuristics.SpecFromOptions(o.heuristic, o.heuristicOpts); err != nil {
			return cfg, err
		}
	default:
		return cfg, nil
	}
	h, err := o.registry.New(spec)
	if err != nil {
		return cfg, err
	}
	cfg.Heuristic = h
	return cfg, nil
}

func runUsage(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod run: "+format+"\n", args...)
	return ErrUsage
}

func runJob(ctx context.Context, o runOptions, engCfg heuristics.EngineConfig, log *slog.Logger, stdout, stderr io.Writer) error {
	out := newDisplay(stdout, stderr, o.progress)
	defer out.close()
	cluster := &driverCluster{}
	prov := &localProvisioner{grace: 10 * time.Second, report: out.report}
	engCfg.OnEvent = func(ev heuristics.Event) { out.event(ev, o.asJSON, o.autoscaling() || o.verbose) }
	engine, err := heuristics.NewEngine(engCfg, cluster, prov)
	if err != nil {
		return err
	}

	jobID, secret := launch.NewJobID(), launch.NewSecret()
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	driver, err := gsync.StartDriver(startCtx, gsync.DriverConfig{
		JobID: jobID, Secret: secret, MinWorkers: o.minNP, Membership: membership.DefaultConfig(), Logger: log,
		OnEpoch: func(e gsync.Epoch) {
			names := make([]string, len(e.Members))
			for i, m := range e.Members {
				names[i] = m.Name
			}
			engine.OnWorld(heuristics.WorldChange{Epoch: e.Number, Members: names, At: time.Now()})
		},
		OnStats: func(worker string, b gsync.StatsBatch) {
			reps := make([]heuristics.StepReport, len(b.Steps))
			for i, s := range b.Steps {
				reps[i] = heuristics.StepReport{Worker: worker, Epoch: s.Epoch, Step: s.Step, Samples: s.Samples,
					Compute: s.Compute, StepTime: s.StepTime, TotalSteps: b.TotalSteps}
			}
			engine.OnReports(worker, reps)
		},
	})
	if err != nil {
		return err
	}
	defer driver.Close()
	cluster.d = driver
	worker := envconfig.ElasticWorker{JobID: jobID, Secret: secret, Seeds: []string{driver.GossipAddr()}}
	jobFile, err := writeJobFile(worker)
	if err != nil {
		return err
	}
	defer os.Remove(jobFile)

	devices := assignGPUs(ctx, o.np, stderr)
	// Workers stop on SIGINT: a SIGTERM sent to one worker means "leave the job
	// gracefully", which the trainers implement.
	jobCtx, stopJob := context.WithCancel(ctx)
	defer stopJob()
	job, err := launch.Start(jobCtx, launch.Spec{
		Argv: o.argv, NP: o.np, Output: out.workerLine, StopSignal: syscall.SIGINT, Placement: launch.Placement(o.placement),
		Env: func(i int) []string {
			env := append(worker.Environ(), fmt.Sprintf("%s=%d", envconfig.EnvLaunchIndex, i))
			if dev, ok := devices.take(i); ok {
				env = append(env, envconfig.EnvVisibleDevices+"="+dev)
			} else if devices != nil {
				out.report("no free GPU for worker %d: it sees every GPU of the host", i)
			}
			return env
		},
	})
	if err != nil {
		return err
	}
	prov.job, prov.devices = job, devices
	for i := range job.PIDs() {
		devices.releaseWhenDone(i, job.Exited(i))
	}
	out.report("job %s, %d workers, driver %s (pid %d)", jobID, o.np, driver.GossipAddr(), os.Getpid())
	for i, pid := range job.PIDs() {
		out.report("worker %d pid %d", i, pid)
	}
	out.report("add a worker with `kill -USR1 %d`, or start one by hand: env $(cat %s) %s",
		os.Getpid(), jobFile, strings.Join(o.argv, " "))

	engineCtx, stopEngine := context.WithCancel(ctx)
	engineDone := make(chan struct{})
	go func() {
		defer close(engineDone)
		_ = engine.Run(engineCtx)
	}()
	go out.follow(engineCtx, engine)
	finishEngine := func() {
		stopEngine()
		<-engineDone
		out.summary(engine.Summary(), o.asJSON, o.autoscaling())
	}

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	finished := driver.Finished()
	var stopLate <-chan time.Time
	var finishedAt time.Time
	stopped := map[int]bool{}
	for {
		select {
		case <-finished:
			// Training is over; the workers of the last world exit by
			// themselves, and any still waiting to join are stopped.
			finished = nil
			finishedAt = time.Now()
			stopLate = time.After(finishGrace)
		case <-stopLate:
			if time.Since(finishedAt) < finishRescueLimit && finishingLastStep(driver, job) {
				// Members of the last world are still redoing its last
				// step (it failed for them alone; sync's rescue): wait.
				stopLate = time.After(finishGrace / 10)
				continue
			}
			// Workers still running now were waiting to join a job that
			// is over: however they exit, they did not fail it.
			for i := range job.PIDs() {
				select {
				case <-job.Exited(i):
				default:
					stopped[i] = true
				}
			}
			stopJob()
		case <-usr1:
			if running := len(driver.Workers()); o.maxNP > 0 && running >= o.maxNP {
				out.report("already %d workers (--max-np %d)", running, o.maxNP)
				continue
			}
			if err := prov.Start(ctx, 1); err != nil {
				out.report("adding a worker: %v", err)
			}
		case <-job.Done():
			finishEngine()
			return jobOutcome(job.Errors(), stopped, driver.Current(), out)
		}
	}
}

// driverCluster is the engine's view of the job through its driver.
type driverCluster struct{ d *gsync.Driver }

func (c *driverCluster) Remove(name string) { c.d.Remove(name) }

func (c *driverCluster) Workers() []heuristics.WorkerInfo {
	ws := c.d.Workers()
	out := make([]heuristics.WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = heuristics.WorkerInfo{Name: w.Name, Host: w.Host, PID: w.PID}
	}
	return out
}

// assignGPUs returns this host's GPUs as a pool that gives each worker
// process one of its own while it runs, in ring order, when the host has
// enough for the np workers started at once; with none (or no NVIDIA driver)
// the workers run on the CPU and the pool is nil.
func assignGPUs(ctx context.Context, np int, stderr io.Writer) *devicePool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	inv, err := gpu.System(ctx)
	if err != nil {
		if !gpu.IsNoGPUs(err) {
			fmt.Fprintf(stderr, "gorovod run: GPU discovery: %v\n", err)
		}
		return nil
	}
	if _, err := gpu.AssignDevices(inv.GPUs, np); err != nil {
		fmt.Fprintf(stderr, "gorovod run: %v; workers choose their GPUs themselves\n", err)
		return nil
	}
	order, _ := gpu.AssignDevices(inv.GPUs, len(inv.GPUs))
	fmt.Fprintf(stderr, "gorovod run: one GPU per worker, in this order: %s\n", strings.Join(order, ", "))
	return newDevicePool(order)
}

// devicePool tracks which worker process holds which GPU, so that workers
// added while the job runs get a free one and a departed worker's GPU is
// handed out again.
type devicePool struct {
	mu    sync.Mutex
	order []string
	owner map[string]int // device → launch index
}

func newDevicePool(order []string) *devicePool {
	return &devicePool{order: order, owner: map[string]int{}}
}

// take gives worker i the first free device in ring order (nil pool: none).
func (p *devicePool) take(i int) (string, bool) {
	if p == nil {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.order {
		if _, used := p.owner[d]; !used {
			p.owner[d] = i
			return d, true
		}
	}
	return "", false
}

// releaseWhenDone frees worker i's device once it has exited.
func (p *devicePool) releaseWhenDone(i int, exited <-chan struct{}) {
	if p == nil {
		return
	}
	go func() {
		<-exited
		p.mu.Lock()
		defer p.mu.Unlock()
		for d, owner := range p.owner {
			if owner == i {
				delete(p.owner, d)
			}
		}
	}()
}

// finishGrace is how long workers get to exit once training is reported
// finished before the launcher stops the rest.
const finishGrace = 3 * time.Second

// finishRescueLimit bounds the wait for members of the last world that are
// still finishing its last step.
const finishRescueLimit = time.Minute

// finishingLastStep says whether a member of the current world that has not
// yet reported the end of training is still running: it is finishing the
// last step, which is not to be cut short.
func finishingLastStep(driver *gsync.Driver, job *launch.Job) bool {
	unfinished := driver.Unfinished()
	if len(unfinished) == 0 {
		return false
	}
	running := map[int]bool{}
	for i, pid := range job.PIDs() {
		select {
		case <-job.Exited(i):
		default:
			running[pid] = true
		}
	}
	for _, w := range driver.Workers() {
		if w.PID != 0 && running[w.PID] && slices.Contains(unfinished, w.Name) {
			return true
		}
	}
	return false
}

// jobOutcome: the job succeeded if some worker finished training and every
// failure was a worker lost to a signal (killed, or stopped by us) — losing
// workers is what an elastic job survives. A worker that exited with an error
// of its own fails the job, unless it was one the launcher stopped because
// training was over.
func jobOutcome(errs []error, stopped map[int]bool, final gsync.Epoch, out *display) error {
	succeeded, lost := 0, 0
	var failed []error
	for i, err := range errs {
		var ee *launch.ExitError
		var xe *exec.ExitError
		switch {
		case err == nil:
			succeeded++
		case stopped[i]:
			lost++
		case errors.As(err, &ee) && errors.As(err, &xe) && xe.ExitCode() == -1:
			lost++ // ended by a signal
		default:
			failed = append(failed, err)
		}
	}
	out.report("%d workers finished, %d lost, %d failed; last world epoch %d had %d workers",
		succeeded, lost, len(failed), final.Number, len(final.Members))
	if len(failed) > 0 {
		return fmt.Errorf("job failed: %w", errors.Join(failed...))
	}
	if succeeded == 0 {
		return errors.New("job failed: no worker finished")
	}
	return nil
}

// writeJobFile records what a hand-started worker needs to join, readable by
// this user only (it holds the job secret).
func writeJobFile(w envconfig.ElasticWorker) (string, error) {
	f, err := os.CreateTemp("", "gorovod-job-*.env")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return "", err
	}
	_, err = f.WriteString(strings.Join(w.Environ(), "\n") + "\n")
	return f.Name(), err
}
