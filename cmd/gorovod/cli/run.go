package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/straggler"
)

// runOptions is `gorovod run`'s command line.
type runOptions struct {
	registry           *heuristics.Registry
	argv               []string
	np, minNP, maxNP   int
	obs                obsOptions
	stallCheck         time.Duration
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
	assignGPUs         bool
	outputDir          string
	cluster            clusterOptions // runcluster.go
	hosts              hostOptions
	security           *securityOptions // security.go
	dataSecurity       transport.Security
	lanes              *int // security.go
	// attach is the directory of a job to take back (--attach); adopt is
	// what is found there; flags are the flags of the command line that
	// started the job (saved in its directory as runArgsFile).
	attach string
	adopt  *job.Adoption
	flags  []string
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

// runCommand is `gorovod run`: the command line of package job's runner (the
// driver of an elastic job, the local launcher of its workers and its
// autoscaling engine), which prints what the job does and adds a worker on
// SIGUSR1.
func runCommand(ctx context.Context, args []string, registry *heuristics.Registry, terminate <-chan os.Signal, stdout, stderr io.Writer) error {
	return runWith(ctx, args, "", registry, terminate, stdout, stderr)
}

// runWith is runCommand; attach, when set, is the directory of the job to
// adopt, whose saved command line args then holds followed by the flags
// given with --attach.
func runWith(ctx context.Context, args []string, attach string, registry *heuristics.Registry, terminate <-chan os.Signal, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gorovod run", flag.ContinueOnError)
	o := runOptions{registry: registry}
	fs.IntVar(&o.np, "np", 2, "workers to start")
	fs.IntVar(&o.minNP, "min-np", 0, "fewest workers the job trains with once started (it starts with --np, waiting --start-timeout for them); with fewer it waits for more, and replaces lost ones where a slot is free (default --np, as Horovod)")
	fs.IntVar(&o.maxNP, "max-np", 0, "most workers (0: no limit); SIGUSR1 adds one up to it")
	// horovodrun's long names for the same three.
	fs.IntVar(&o.np, "num-proc", 2, "horovodrun's name for --np")
	fs.IntVar(&o.minNP, "min-num-proc", 0, "horovodrun's name for --min-np")
	fs.IntVar(&o.maxNP, "max-num-proc", 0, "horovodrun's name for --max-np")
	o.obs.register(fs)
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
	fs.BoolVar(&o.assignGPUs, "assign-gpus", false, "give each worker started on this host a GPU of its own: CUDA_VISIBLE_DEVICES names one (the worker sees it as device 0), in NVLink/PCIe ring order, when the host has at least as many GPUs as workers; scripts then use device 0, or local_rank() % device_count(), not local_rank(). Off (the default; "+envconfig.EnvAssignGPUs+"=1 turns it on): every worker sees the GPUs this process sees, as under horovodrun, and torch.cuda.set_device(hvd.local_rank()) gives each its own")
	fs.StringVar(&o.outputDir, "output-dir", "", "the job's `directory`: each worker on this host writes its output there (worker-<i>.stdout, .stderr), which this process prints as it grows, beside the job's record (record.tsv); workers outlive this process, and 'gorovod follow DIR' shows the job again (default: a new directory under $TMPDIR, removed when the job ends under this process; one given here is kept)")
	o.hosts.register(fs)
	o.security = securityFlags(fs)
	o.lanes = lanesFlag(fs)
	o.cluster.addFlags(fs)
	fs.StringVar(&o.attach, "attach", "", "take back the running job whose job `directory` (--output-dir) this is, after its 'gorovod run' died: the same flags and trainer (saved there), with the flags given here on top; its workers on this host go on training, and this process drives the job to its end as the one that started it would have")
	if err := parseFlags(fs, args, runUsageText, stdout, stderr); err != nil {
		return err
	}
	if o.attach != "" {
		if attach != "" || len(fs.Args()) > 0 {
			return runUsage(stderr, "--attach DIR takes the trainer and flags the job started with: give no trainer")
		}
		saved, err := readRunArgs(o.attach)
		if err != nil {
			return &commandError{command: "run", err: err}
		}
		var now []string
		for i := 0; i < len(args); i++ {
			switch a := args[i]; {
			case a == "--attach" || a == "-attach":
				i++
			case strings.HasPrefix(a, "--attach=") || strings.HasPrefix(a, "-attach="):
			default:
				now = append(now, a)
			}
		}
		combined := slices.Concat(saved.Flags, now, []string{"--"}, saved.Argv)
		return runWith(ctx, combined, o.attach, registry, terminate, stdout, stderr)
	}
	o.attach = attach
	if attach != "" {
		if abs, err := filepath.Abs(attach); err == nil {
			o.attach = abs
		}
	}
	o.flags = args[:len(args)-len(fs.Args())]
	if n := len(o.flags); n > 0 && o.flags[n-1] == "--" {
		o.flags = o.flags[:n-1]
	}
	if *listHeuristics {
		r := o.registry
		for _, name := range r.Names() {
			fmt.Fprintf(stdout, "%-20s %s\n", name, r.Summary(name))
		}
		return nil
	}
	if !flagGiven(fs, "replace-stragglers") && (o.heuristic != "" || o.heuristicConfig != "") {
		o.replaceStragglers = true
	}
	if o.minNP == 0 {
		o.minNP = o.np
	}
	o.argv = fs.Args()
	if len(o.argv) > 0 && o.argv[0] == "--" {
		o.argv = o.argv[1:]
	}
	if o.cluster.gorovodJob != "" { // gorovodjob.go: the spec sets the workers and the command
		var gj *gorovodJobDriver
		var err error
		ctx, gj, err = startGorovodJob(ctx, &o, fs, func(format string, args ...any) { fmt.Fprintf(stderr, "gorovod run: "+format+"\n", args...) })
		if u := (usageError{}); errors.As(err, &u) {
			return runUsage(stderr, "%s", u.msg)
		} else if err != nil {
			return &commandError{command: "run", err: err}
		}
		defer gj.stop()
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
	if !flagGiven(fs, "assign-gpus") {
		var err error
		if o.assignGPUs, err = envconfig.AssignGPUs(os.Getenv); err != nil {
			return runUsage(stderr, "%v", err)
		}
	}
	var err error
	if o.dataSecurity, err = o.security.value(); err != nil {
		return runUsage(stderr, "%v", err)
	}
	if err := checkLanes(*o.lanes); err != nil {
		return runUsage(stderr, "%v", err)
	}
	if err := o.cluster.check(o.np, o.maxNP); err != nil {
		return runUsage(stderr, "%v", err)
	}
	if o.attach != "" {
		if o.cluster.slurm || o.cluster.kubernetes || o.cluster.gorovodJob != "" {
			return runUsage(stderr, "--attach takes back jobs whose workers 'gorovod run' started itself, not --slurm, --kubernetes or --gorovodjob ones")
		}
		if o.outputDir != "" && !samePath(o.outputDir, o.attach) {
			return runUsage(stderr, "--attach %s with --output-dir %s: the job's directory is the one adopted", o.attach, o.outputDir)
		}
		if o.adopt, err = job.ReadAdoption(o.attach); err != nil {
			return &commandError{command: "run", err: err}
		}
		o.outputDir = o.attach
	}
	if err := o.hosts.prepare(); err != nil {
		return runUsage(stderr, "%v", err)
	}
	if _, err := exec.LookPath(o.argv[0]); err != nil && !o.cluster.kubernetes { // a pod's command is in its image
		return runUsage(stderr, "%s", trainerProblem(o.argv[0], err))
	}
	engCfg, err := o.engineConfig()
	if err != nil {
		return runUsage(stderr, "%v", err)
	}
	if o.stallCheck, err = o.obs.check(); err != nil {
		return runUsage(stderr, "%v", err)
	}
	log, err := o.obs.log.Logger(stderr)
	if err != nil {
		return runUsage(stderr, "%v", err)
	}
	if o.outputDir != "" && o.adopt == nil {
		// Made here, the last check, rather than by the job: a directory
		// that cannot be made is this flag's mistake.
		if err := os.MkdirAll(o.outputDir, 0o700); err != nil {
			return runUsage(stderr, "--output-dir %s: %v", o.outputDir, err)
		}
	}
	err = runJob(ctx, o, engCfg, log, terminate, stdout, stderr)
	if cause := context.Cause(ctx); errors.Is(cause, errJobDeleted) {
		err = cause // --gorovodjob: its GorovodJob was deleted
	}
	if gj := o.cluster.gorovodJobDriver; gj != nil && !errors.Is(err, ErrDetached) {
		// This driver's end is the job's: no replacement takes it back.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		gj.endAdoption(ectx)
		cancel()
	}
	if err != nil {
		return &commandError{command: "run", err: err}
	}
	return nil
}

const runUsageText = `Usage: gorovod run [flags] -- TRAINER [ARGS...]

Runs an elastic training job on this host: a driver plus --np worker processes
running TRAINER (a program built on package sync, such as examples/synthetic
or examples/fashion-mnist). Workers can be added (kill -USR1 <pid of gorovod
run>, or by hand with 'gorovod attach JOBFILE -- TRAINER [ARGS...]' and the
job file it prints), leave (kill -TERM <worker>) or die while training goes
on; with --heuristic the job grows, shrinks and replaces stragglers by itself.
Each worker's lines are printed prefixed by its launch index, [i]. Workers
see the GPUs this process sees (CUDA_VISIBLE_DEVICES as set here), as under
horovodrun: torch.cuda.set_device(hvd.local_rank()) gives each its own. With
--assign-gpus each worker of this host gets one GPU of its own instead, as
device 0.

With -H host1:2,host2:2, --hostfile FILE or --host-discovery-script CMD the
workers run on those hosts, started over ssh (see README, "Several machines").
With --slurm they are job steps of the Slurm allocation gorovod runs in, with
--kubernetes pods (docs/clusters.md).

'gorovod run --attach DIR' takes back the job whose directory DIR is, after
the 'gorovod run' that started it died: its workers on this host train on,
and this process becomes the job's driver, with the flags and trainer the
job started with (flags given here are added on top).`

// engineConfig builds the autoscaling engine's configuration from the flags.
func (o *runOptions) engineConfig() (heuristics.EngineConfig, error) {
	cfg := heuristics.DefaultEngineConfig()
	cfg.MinWorkers, cfg.MaxWorkers, cfg.Skip, cfg.TotalSteps = o.minNP, o.maxNP, o.skipSteps, o.totalSteps
	if o.skipSteps == 0 {
		cfg.Skip = -1 // --skip-steps 0: measure every step
	}
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

// trainerProblem says why the trainer named name cannot be run, from
// exec.LookPath's err, naming it once (LookPath's error names it twice,
// and its cause a third time).
func trainerProblem(name string, err error) string {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	switch {
	case errors.Is(err, exec.ErrNotFound):
		if _, serr := os.Stat(name); serr == nil {
			return fmt.Sprintf("trainer %q: no such command in $PATH (the one in this directory is ./%s)", name, name)
		}
		return fmt.Sprintf("trainer %q: no such command in $PATH", name)
	case errors.Is(err, fs.ErrPermission) && strings.HasSuffix(name, ".py"):
		return fmt.Sprintf("trainer %q: not executable (run it with its interpreter: -- python3 %s)", name, name)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("trainer %q: not executable (permission denied)", name)
	}
	return fmt.Sprintf("trainer %q: %v", name, err)
}

// shellWords is argv as a shell command line, each word quoted where the
// shell would split or expand it, for a hint to copy.
func shellWords(argv []string) string {
	words := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			words[i] = a
		} else {
			words[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(words, " ")
}

func runUsage(stderr io.Writer, format string, args ...any) error {
	fmt.Fprintf(stderr, "gorovod run: "+format+"\nRun 'gorovod run --help' for the flags.\n", args...)
	return ErrUsage
}

func runJob(ctx context.Context, o runOptions, engCfg heuristics.EngineConfig, log *slog.Logger, terminate <-chan os.Signal, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := newDisplay(stdout, stderr, o.progress)
	defer out.close()
	watch, err := startWatchers(ctx, &o.obs, out, o.asJSON, log)
	if err != nil {
		return err
	}
	defer watch.stop()
	jobID := job.NewJobID()
	if o.adopt != nil {
		jobID = o.adopt.Record.JobID
	}
	outputDir, keepOutput := o.outputDir, o.outputDir != ""
	if outputDir == "" {
		outputDir = filepath.Join(os.TempDir(), "gorovod-"+jobID)
	}
	// Absolute: workers on other hosts write their output at the same path
	// there, and a runner that takes the job back looks for it there.
	if abs, err := filepath.Abs(outputDir); err == nil {
		outputDir = abs
	}
	var sinks []job.Sink
	if watch.needed() {
		sinks = append(sinks, watch) // first: the last progress record comes before the summary
	}
	// The job's first lines, before any of its workers' (the job holds
	// their events until it has announced itself).
	banner := func(e job.JobStarted) {
		watch.announce()
		out.report("add a worker with `kill -USR1 %d`, or start one by hand: gorovod attach %s -- %s",
			os.Getpid(), e.JobFile, shellWords(o.argv))
		out.report("job directory %s: the workers here write their output there and train on if this process dies; `gorovod follow %s` shows the job then, `gorovod run --attach %s` takes it back", outputDir, outputDir, outputDir)
	}
	sinks = append(sinks, runSink{d: out, asJSON: o.asJSON, autoscaling: o.autoscaling(), verbose: o.obs.verbose, banner: banner})
	cfg := job.Config{
		JobID: jobID, OutputDir: outputDir,
		Argv: o.argv, Workers: o.np, MinWorkers: o.minNP, MaxWorkers: o.maxNP, Autoscaling: engCfg,
		Logger: log, JobFile: true, Gossip: membership.DefaultConfig(), ReplaceLost: true,
		Sinks: sinks, Env: o.obs.workerEnv(), Timeline: o.obs.timeline, StallCheck: o.stallCheck,
		Adopt: o.adopt,
	}
	if o.dataSecurity != transport.SecurityDefault {
		cfg.Env = append(cfg.Env, envconfig.EnvDataSecurity+"="+o.dataSecurity.String())
	}
	if *o.lanes != 0 {
		cfg.Env = append(cfg.Env, envconfig.EnvTCPLanes+"="+strconv.Itoa(*o.lanes))
	}
	if err := o.hosts.configure(ctx, &cfg, launch.Placement(o.placement), o.assignGPUs, func(msg string) { out.report("%s", msg) }); err != nil {
		return err
	}
	// --slurm and --kubernetes replace the launcher (and the hosts).
	closeCluster, err := o.cluster.apply(ctx, &cfg, out.report)
	if err != nil {
		return err
	}
	defer closeCluster()
	j, err := job.Start(ctx, cfg)
	if err != nil {
		if !keepOutput {
			os.RemoveAll(outputDir)
		}
		return err
	}
	if !keepOutput {
		// Printed in full by now; kept only when this process dies first.
		defer os.RemoveAll(outputDir)
	}
	if o.adopt == nil {
		if err := writeRunArgs(outputDir, o.flags, o.argv); err != nil {
			out.report("the job cannot be taken back with --attach if this process dies: %v", err)
		}
	}
	if gj := o.cluster.gorovodJobDriver; gj != nil {
		gj.started(ctx, j, cfg.MinWorkers, cfg.ProbeTimeout)
	}
	watch.attach(j)
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	go out.follow(followCtx, j)
	if watch.needed() {
		go watch.follow(followCtx, j)
	}

	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	leaving := false
	superseded := j.Superseded()
	for {
		select {
		case <-superseded:
			superseded = nil
			if gj := o.cluster.gorovodJobDriver; gj != nil && gj.canHandOver() {
				// The driver pod that replaced this one (its node was
				// only cut off) drives the job: leave the workers to it.
				out.report("a newer driver of this job took it back: leaving the running workers to it")
				gj.detach()
				return ErrDetached
			}
			out.report("a newer driver of this job took it back: this one no longer drives it, and waits for the workers it holds to end")
		case <-terminate:
			if gj := o.cluster.gorovodJobDriver; gj != nil && gj.canHandOver() {
				// Its pod deleted: the scheduler starts another driver
				// pod, which takes the job back (deleting the GorovodJob
				// stops the job).
				out.report("SIGTERM: leaving the running workers to the driver pod the gorovod scheduler starts in this one's place")
				gj.detach()
				return ErrDetached
			}
			if leaving {
				out.report("SIGTERM again: stopping every worker now")
				cancel()
				continue
			}
			leaving = true
			out.report("SIGTERM: asking every worker to leave at a committed step (SIGTERM again or SIGINT stops them at once)")
			j.LeaveAll()
		case <-usr1:
			var limit *job.LimitError
			switch err := j.AddWorkers(ctx, 1); {
			case errors.As(err, &limit):
				out.report("already %d workers (--max-np %d)", limit.Workers, limit.Max)
			case err != nil:
				out.report("adding a worker: %v", err)
			}
		case <-j.Done():
			outcome, err := j.Wait()
			if rerr := watch.finish(outcome); err == nil {
				err = rerr
			}
			return err
		}
	}
}

// runArgsFile, in a job's directory, is the command line that started the
// job (flags and trainer), for `gorovod run --attach`.
const runArgsFile = "run.json"

// maxRunArgs bounds what readRunArgs reads.
const maxRunArgs = 1 << 20

type runArgs struct {
	Flags []string `json:"flags"`
	Argv  []string `json:"argv"`
}

func writeRunArgs(dir string, flags, argv []string) error {
	b, err := json.Marshal(runArgs{Flags: flags, Argv: argv})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, runArgsFile), b, 0o600)
}

func readRunArgs(dir string) (runArgs, error) {
	f, err := os.Open(filepath.Join(dir, runArgsFile))
	if err != nil {
		return runArgs{}, fmt.Errorf("--attach %s: not the directory of a job started by 'gorovod run' (%w)", dir, err)
	}
	defer f.Close()
	var a runArgs
	if err := json.NewDecoder(io.LimitReader(f, maxRunArgs)).Decode(&a); err != nil {
		return runArgs{}, fmt.Errorf("--attach %s: %s: %w", dir, runArgsFile, err)
	}
	if len(a.Argv) == 0 {
		return runArgs{}, fmt.Errorf("--attach %s: %s names no trainer", dir, runArgsFile)
	}
	return a, nil
}

// samePath says whether a and b name the same directory (one may be
// relative, the other absolute).
func samePath(a, b string) bool {
	if fa, err := os.Stat(a); err == nil {
		if fb, err := os.Stat(b); err == nil {
			return os.SameFile(fa, fb)
		}
	}
	return filepath.Clean(a) == filepath.Clean(b)
}
