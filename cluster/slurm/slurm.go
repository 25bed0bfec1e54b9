package slurm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
)

// Host is a node of an allocation and the tasks Slurm placed on it.
type Host struct {
	Name  string
	Slots int
}

// Allocation is the Slurm job a process runs in.
type Allocation struct {
	JobID  string
	Hosts  []Host // in SLURM_JOB_NODELIST's order
	NTasks int    // SLURM_NTASKS, or the sum of the hosts' slots
	// CPUsPerTask is SLURM_CPUS_PER_TASK (0 when not asked for).
	CPUsPerTask int
}

// CurrentAllocation reads the allocation this process runs in from Slurm's
// environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE,
// SLURM_NTASKS); ok is false outside Slurm.
func CurrentAllocation() (a Allocation, ok bool, err error) {
	e, ok, err := envconfig.LoadSlurm(os.Getenv)
	if !ok || err != nil {
		return a, ok, err
	}
	a = Allocation{JobID: e.JobID, NTasks: e.NTasks, CPUsPerTask: e.CPUsPerTask}
	for _, h := range e.Hosts {
		a.Hosts = append(a.Hosts, Host{Name: h.Name, Slots: h.Slots})
	}
	return a, true, nil
}

// Mode is how workers are placed.
type Mode int

const (
	// Steps runs each worker as an srun job step inside one allocation.
	Steps Mode = iota
	// Jobs submits each worker as a one-task batch job of its own.
	Jobs
)

func (m Mode) String() string {
	switch m {
	case Steps:
		return "steps"
	case Jobs:
		return "jobs"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config configures a Provisioner. A zero field means its default.
type Config struct {
	// Argv is the trainer command every worker runs.
	Argv []string
	// Env returns worker i's own environment entries (NAME=value): what it
	// needs to join the job, the secret included. They are added to Environ.
	Env func(i int) []string
	// Mode places workers as steps of an allocation (default) or as jobs.
	Mode Mode
	// JobID is the allocation steps run in. Default: the one this process
	// runs in (CurrentAllocation). Steps mode only.
	JobID string
	// Slots is how many workers may run at once. Default: the allocation's
	// task count in Steps mode, no limit in Jobs mode.
	Slots int
	// CPUsPerWorker is each worker's --cpus-per-task. Default 1.
	CPUsPerWorker int
	// ExtraArgs go to every srun (Steps) or sbatch (Jobs) command before the
	// worker command: --gres=gpu:1, --partition=..., --time=...
	ExtraArgs []string
	// Grace is a removed worker's time to exit by itself, and then to leave
	// after its SIGTERM, before it is killed. Default 10 s.
	Grace time.Duration
	// Output receives the lines a worker prints (Steps mode: srun forwards
	// them). Default "[i] line" on this process's stdout / stderr. In Jobs
	// mode the workers write to OutputDir instead.
	Output func(i int, stream string, line []byte)
	// OutputDir holds the Jobs mode workers' output files,
	// gorovod-worker-<job id>.out; it must be readable here and writable on
	// the nodes (a shared file system). Default: the current directory.
	OutputDir string
	// PollInterval is how often Jobs mode asks squeue which jobs still
	// exist. Default 1 s.
	PollInterval time.Duration
	// Environ is the environment of the Slurm commands (srun, sbatch,
	// scancel, squeue) and, through them, of the workers. Default: this
	// process's environment.
	Environ []string
	// Logf receives what the provisioner does (nil: nothing).
	Logf func(format string, args ...any)
}

// DefaultConfig returns the defaults: Steps mode, one CPU per worker, 10 s
// of grace, squeue every second.
func DefaultConfig() Config {
	return Config{Mode: Steps, CPUsPerWorker: 1, Grace: 10 * time.Second, PollInterval: time.Second}
}

// ErrFull is Start asked for more workers than the allocation's slots.
var ErrFull = errors.New("slurm: the allocation has no free slot")

// Worker is what the provisioner knows of a worker it started.
type Worker struct {
	Index int    // in start order, never reused
	ID    string // step "JOB.STEP" or job "JOB"; "" until known
	Host  string // "" until the worker has reported
	PID   int    // the trainer's pid on Host; 0 until reported
	Done  bool   // its step or job has ended
	Err   error  // Steps mode: how srun exited
}

type worker struct {
	Worker
	exited  chan struct{}
	job     *launch.Job // Steps mode
	outFile string      // Jobs mode
}

// Provisioner starts and stops workers through Slurm; it implements
// heuristics.Provisioner.
type Provisioner struct {
	cfg    Config
	ctx    context.Context // the srun processes' lifetime
	cancel context.CancelFunc
	logf   func(format string, args ...any)

	mu      sync.Mutex
	workers []*worker
	closed  bool
	poller  chan struct{} // Jobs mode: closed when the squeue poller ends
}

var _ heuristics.Provisioner = (*Provisioner)(nil)

// markerPrefix starts the line each worker's shell prints before it becomes
// the trainer: "gorovod-slurm-worker <id> <host> <pid>".
const markerPrefix = "gorovod-slurm-worker "

// wrapper runs as /bin/sh -c wrapper gorovod-worker TRAINER ARGS...
const wrapper = `echo "` + markerPrefix + `${SLURM_JOB_ID}${SLURM_STEP_ID:+.$SLURM_STEP_ID} $(uname -n) $$" >&2; exec "$@"`

// New checks cfg and returns a Provisioner with no worker yet.
func New(cfg Config) (*Provisioner, error) {
	def := DefaultConfig()
	if len(cfg.Argv) == 0 {
		return nil, errors.New("slurm: no worker command")
	}
	if cfg.Env == nil {
		cfg.Env = func(int) []string { return nil }
	}
	if cfg.CPUsPerWorker <= 0 {
		cfg.CPUsPerWorker = def.CPUsPerWorker
	}
	if cfg.Grace <= 0 {
		cfg.Grace = def.Grace
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = def.PollInterval
	}
	if cfg.Environ == nil {
		cfg.Environ = os.Environ()
	}
	var programs []string
	switch cfg.Mode {
	case Steps:
		programs = []string{"srun", "scancel"}
		if cfg.JobID == "" || cfg.Slots <= 0 {
			a, ok, err := CurrentAllocation()
			if err != nil {
				return nil, err
			}
			if !ok && cfg.JobID == "" {
				return nil, errors.New("slurm: not inside a Slurm allocation (no SLURM_JOB_ID) and no Config.JobID")
			}
			if cfg.JobID == "" {
				cfg.JobID = a.JobID
			}
			if cfg.Slots <= 0 {
				if !ok || a.JobID != cfg.JobID {
					return nil, fmt.Errorf("slurm: Config.Slots is needed for allocation %s, which this process does not run in", cfg.JobID)
				}
				cfg.Slots = a.NTasks
			}
		}
	case Jobs:
		programs = []string{"sbatch", "scancel", "squeue"}
		if cfg.OutputDir == "" {
			cfg.OutputDir = "."
		}
		dir, err := filepath.Abs(cfg.OutputDir)
		if err != nil {
			return nil, err
		}
		cfg.OutputDir = dir
	default:
		return nil, fmt.Errorf("slurm: unknown mode %v", cfg.Mode)
	}
	for _, prog := range programs {
		if _, err := exec.LookPath(prog); err != nil {
			return nil, fmt.Errorf("slurm: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Provisioner{cfg: cfg, ctx: ctx, cancel: cancel, logf: cfg.Logf}
	if p.logf == nil {
		p.logf = func(string, ...any) {}
	}
	if cfg.Mode == Jobs {
		p.poller = make(chan struct{})
		go p.pollJobs()
	}
	return p, nil
}

// Start launches n more workers (heuristics.Provisioner). In Steps mode it
// starts nothing and returns ErrFull if that would exceed the slots.
func (p *Provisioner) Start(ctx context.Context, n int) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("slurm: provisioner closed")
	}
	running := 0
	for _, w := range p.workers {
		if !w.Done {
			running++
		}
	}
	if p.cfg.Slots > 0 && running+n > p.cfg.Slots {
		p.mu.Unlock()
		return fmt.Errorf("%w: %d workers running, %d more asked for, %d slots", ErrFull, running, n, p.cfg.Slots)
	}
	p.mu.Unlock()
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if p.cfg.Mode == Steps {
			err = p.startStep()
		} else {
			err = p.submitJob(ctx)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// newWorker registers the next worker under the lock.
func (p *Provisioner) newWorker() (*worker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("slurm: provisioner closed")
	}
	w := &worker{Worker: Worker{Index: len(p.workers)}, exited: make(chan struct{})}
	p.workers = append(p.workers, w)
	return w, nil
}

// workerEnv is worker i's own environment entries and its launch index.
func (p *Provisioner) workerEnv(i int) []string {
	return append(slices.Clone(p.cfg.Env(i)), fmt.Sprintf("%s=%d", envconfig.EnvLaunchIndex, i))
}

func (p *Provisioner) startStep() error {
	w, err := p.newWorker()
	if err != nil {
		return err
	}
	argv := stepArgv(p.cfg.JobID, w.Index, "", p.cfg.CPUsPerWorker, p.cfg.ExtraArgs, p.cfg.Argv)
	base := slices.DeleteFunc(slices.Clone(p.cfg.Environ), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(allocationShape, name)
	})
	own := p.workerEnv(w.Index)
	job, err := launch.Start(p.ctx, launch.Spec{
		Argv: argv, NP: 1, CPUs: p.cfg.CPUsPerWorker, StopSignal: syscall.SIGTERM, StopGrace: p.cfg.Grace,
		Environ: base, Env: func(int) []string { return own },
		Output: func(_ int, stream string, line []byte) {
			if p.noteMarker(w, stream, line) {
				return
			}
			p.output(w.Index, stream, line)
		},
	})
	if err != nil {
		p.mu.Lock()
		w.Done, w.Err = true, err
		close(w.exited)
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	w.job = job
	p.mu.Unlock()
	p.logf("worker %d: srun started (pid %d)", w.Index, job.PIDs()[0])
	go func() {
		err := job.Wait()
		p.mu.Lock()
		w.Done, w.Err = true, err
		close(w.exited)
		p.mu.Unlock()
		p.logf("worker %d (step %s) ended: %v", w.Index, w.ID, err)
	}()
	return nil
}

// stepArgv is the srun command that runs worker index as a one-task step of
// allocation jobID (on host, when not ""), through the wrapper that reports
// its step, host and pid.
func stepArgv(jobID string, index int, host string, cpus int, extra, trainer []string) []string {
	argv := []string{"srun", "--jobid=" + jobID, "--job-name=gorovod-worker-" + strconv.Itoa(index),
		"--nodes=1", "--ntasks=1", "--cpus-per-task=" + strconv.Itoa(cpus),
		// --exact: the step gets the CPUs it asks for, not every CPU of
		// the node, so that the next worker's step can start beside it.
		// --export=ALL: the worker's environment (job, secret, seeds)
		// goes to the task, whatever SLURM_EXPORT_ENV the job set.
		// --kill-on-bad-exit=0: one worker failing is the elastic
		// layer's business, not a reason to end the step.
		"--exact", "--export=ALL", "--kill-on-bad-exit=0"}
	if host != "" {
		argv = append(argv, "--nodelist="+host)
	}
	argv = append(argv, extra...)
	argv = append(argv, "/bin/sh", "-c", wrapper, "gorovod-worker")
	return append(argv, trainer...)
}

// allocationShape are the variables of the allocation's own shape
// (SLURM_NTASKS=8, ...): srun reads them as input, and a step's task would
// see the allocation's rather than its own. The steps' flags override them;
// the provisioner also removes them from srun's environment.
var allocationShape = []string{"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE", "SLURM_NNODES"}

// parseMarker reads a wrapper's "gorovod-slurm-worker <id> <host> <pid>"
// line.
func parseMarker(stream string, line []byte) (id, host string, pid int, ok bool) {
	rest, ok := strings.CutPrefix(string(line), markerPrefix)
	if !ok || stream != "stderr" {
		return "", "", 0, false
	}
	f := strings.Fields(rest)
	if len(f) != 3 {
		return "", "", 0, false
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil || pid <= 0 {
		return "", "", 0, false
	}
	return f[0], f[1], pid, true
}

func (p *Provisioner) output(i int, stream string, line []byte) {
	if p.cfg.Output != nil {
		p.cfg.Output(i, stream, line)
		return
	}
	f := os.Stdout
	if stream == "stderr" {
		f = os.Stderr
	}
	fmt.Fprintf(f, "[%d] %s\n", i, line)
}

// noteMarker records a worker's step or job, host and pid from its marker
// line; it says whether line was one.
func (p *Provisioner) noteMarker(w *worker, stream string, line []byte) bool {
	id, host, pid, ok := parseMarker(stream, line)
	if !ok {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.Host != "" {
		return false // a line the trainer printed that looks like a marker
	}
	w.ID, w.Host, w.PID = id, host, pid
	return true
}

func (p *Provisioner) submitJob(ctx context.Context) error {
	w, err := p.newWorker()
	if err != nil {
		return err
	}
	fail := func(err error) error {
		p.mu.Lock()
		w.Done, w.Err = true, err
		close(w.exited)
		p.mu.Unlock()
		return err
	}
	quoted := make([]string, len(p.cfg.Argv))
	for i, a := range p.cfg.Argv {
		quoted[i] = shellQuote(a)
	}
	script := "#!/bin/sh\n" + strings.Replace(wrapper, `"$@"`, strings.Join(quoted, " "), 1) + "\n"
	args := []string{"--parsable", "--job-name=gorovod-worker-" + strconv.Itoa(w.Index),
		"--ntasks=1", "--cpus-per-task=" + strconv.Itoa(p.cfg.CPUsPerWorker),
		"--export=ALL", "--output=" + filepath.Join(p.cfg.OutputDir, "gorovod-worker-%j.out")}
	args = append(args, p.cfg.ExtraArgs...)
	cmd := exec.CommandContext(ctx, "sbatch", args...)
	cmd.Env = slices.Concat(p.cfg.Environ, p.workerEnv(w.Index))
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("slurm: sbatch: %w: %s", err, strings.TrimSpace(string(out))))
	}
	// --parsable prints "jobid" or "jobid;cluster".
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	if _, err := strconv.ParseUint(id, 10, 64); err != nil {
		return fail(fmt.Errorf("slurm: sbatch printed %q, not a job id", out))
	}
	p.mu.Lock()
	w.ID, w.outFile = id, filepath.Join(p.cfg.OutputDir, "gorovod-worker-"+id+".out")
	p.mu.Unlock()
	p.logf("worker %d: submitted as job %s", w.Index, id)
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// pollJobs marks Jobs mode workers done once squeue no longer lists their
// job.
func (p *Provisioner) pollJobs() {
	defer close(p.poller)
	t := time.NewTicker(p.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		var ids []string
		for _, w := range p.workers {
			if !w.Done && w.ID != "" {
				ids = append(ids, w.ID)
			}
		}
		p.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		listed, err := p.queued(p.ctx, ids)
		if err != nil {
			p.logf("squeue: %v", err)
			continue
		}
		p.mu.Lock()
		for _, w := range p.workers {
			if !w.Done && w.ID != "" && slices.Contains(ids, w.ID) && !listed[w.ID] {
				w.Done = true
				close(w.exited)
				p.logf("worker %d (job %s) ended", w.Index, w.ID)
			}
		}
		p.mu.Unlock()
	}
}

// queued returns which of ids squeue still lists (pending, running or
// completing).
func (p *Provisioner) queued(ctx context.Context, ids []string) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "squeue", "--noheader", "--format=%i", "--jobs="+strings.Join(ids, ","))
	cmd.Env = p.cfg.Environ
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		// squeue fails with "Invalid job id specified" once every job
		// of the list has been purged.
		if errors.As(err, &ee) && strings.Contains(string(ee.Stderr), "Invalid job id") {
			return map[string]bool{}, nil
		}
		return nil, err
	}
	listed := map[string]bool{}
	for _, id := range strings.Fields(string(out)) {
		listed[id] = true
	}
	return listed, nil
}

// Workers lists the workers started so far.
func (p *Provisioner) Workers() []Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Worker, len(p.workers))
	for i, w := range p.workers {
		out[i] = w.Worker
	}
	return out
}

// locate finds the worker the engine means (by host and pid). Jobs mode
// workers report in their output files, read here on demand.
func (p *Provisioner) locate(info heuristics.WorkerInfo) *worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.workers {
		if w.Host == "" && w.outFile != "" {
			if line, err := firstLine(w.outFile); err == nil {
				if _, host, pid, ok := parseMarker("stderr", []byte(line)); ok {
					w.Host, w.PID = host, pid
				}
			}
		}
		if w.PID != 0 && w.PID == info.PID && w.Host == info.Host {
			return w
		}
	}
	return nil
}

func firstLine(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	if s.Scan() {
		return s.Text(), nil
	}
	return "", errors.New("empty")
}

// Stop makes sure a worker the engine removed ends (heuristics.Provisioner):
// it waits Grace for the worker to exit by itself, then sends it SIGTERM
// through Slurm (it leaves gracefully), waits Grace again, then kills its
// step or job. A worker this provisioner did not start is left alone.
func (p *Provisioner) Stop(ctx context.Context, info heuristics.WorkerInfo) error {
	w := p.locate(info)
	if w == nil {
		p.logf("worker %s (%s pid %d) is not one of ours; not stopping it", info.Name, info.Host, info.PID)
		return nil
	}
	for _, step := range []struct {
		action string
		args   []string
	}{
		{"", nil},
		{"SIGTERM", p.signalArgs("TERM", w.ID)},
		{"SIGKILL", p.signalArgs("KILL", w.ID)},
	} {
		if step.args != nil {
			p.logf("worker %d (%s) still running; sending %s", w.Index, w.ID, step.action)
			if err := p.scancel(ctx, step.args...); err != nil {
				return err
			}
		}
		t := time.NewTimer(p.cfg.Grace)
		select {
		case <-w.exited:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return fmt.Errorf("slurm: worker %d (%s, %s pid %d) survived SIGKILL", w.Index, w.ID, w.Host, w.PID)
}

// signalArgs are scancel's arguments to send sig to a worker's processes.
// Steps: `scancel --signal=KILL` and plain `scancel` of a step are the same
// (SIGKILL at once). Jobs: the trainer is the batch shell, which scancel
// leaves out unless told --full.
func (p *Provisioner) signalArgs(sig, id string) []string {
	if p.cfg.Mode == Jobs {
		return []string{"--signal=" + sig, "--full", id}
	}
	return []string{"--signal=" + sig, id}
}

func (p *Provisioner) scancel(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "scancel", args...)
	cmd.Env = p.cfg.Environ
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("slurm: scancel %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Close ends every worker still running, as at the end of the job: SIGTERM
// through Slurm, Grace to leave, then the steps are killed and the jobs
// cancelled. It returns once they are gone or ctx ends.
func (p *Provisioner) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	var live []*worker
	for _, w := range p.workers {
		if !w.Done {
			live = append(live, w)
		}
	}
	p.mu.Unlock()
	defer func() {
		p.cancel()
		if p.poller != nil {
			<-p.poller
		}
	}()
	var errs []error
	waitAll := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		for _, w := range live {
			select {
			case <-w.exited:
			case <-ctx.Done():
				return false
			case <-t.C:
				return false
			}
		}
		return true
	}
	ids := func() []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var out []string
		for _, w := range live {
			if !w.Done && w.ID != "" {
				out = append(out, w.ID)
			}
		}
		return out
	}
	if len(live) == 0 {
		return nil
	}
	if p.cfg.Mode == Jobs {
		// Pending jobs go at once; running ones get SIGTERM.
		if pending := ids(); len(pending) > 0 {
			_ = p.scancel(ctx, append([]string{"--state=PENDING"}, pending...)...)
		}
	}
	for _, sig := range []string{"TERM", "KILL"} {
		if left := ids(); len(left) > 0 {
			for _, id := range left {
				if err := p.scancel(ctx, p.signalArgs(sig, id)...); err != nil {
					p.logf("%v", err)
				}
			}
		}
		if waitAll(p.cfg.Grace) {
			return nil
		}
	}
	if p.cfg.Mode == Jobs {
		if left := ids(); len(left) > 0 {
			errs = append(errs, p.scancel(ctx, left...))
		}
	}
	if !waitAll(p.cfg.Grace) {
		errs = append(errs, fmt.Errorf("slurm: workers still running: %v", ids()))
	}
	return errors.Join(errs...)
}
