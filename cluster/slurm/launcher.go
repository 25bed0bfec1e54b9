package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/job/launch"
)

// LauncherConfig configures a Launcher. A zero field means its default.
type LauncherConfig struct {
	// JobID is the allocation the steps run in. Default: the one this
	// process runs in (CurrentAllocation).
	JobID string
	// CPUsPerWorker is each step's --cpus-per-task (and the worker's
	// GOMAXPROCS unless the environment sets one). Default: the
	// allocation's SLURM_CPUS_PER_TASK, else 1.
	CPUsPerWorker int
	// ExtraArgs go to every srun before the worker command: --gres=gpu:1,
	// --mem-per-cpu=..., ...
	ExtraArgs []string
	// StopGrace is how long a step stopped at the end of the job (its
	// launch context ended: job.StopSignal through scancel) has before it is
	// killed. Default 5 s.
	StopGrace time.Duration
	// Logf receives what the launcher does (nil: nothing).
	Logf func(format string, args ...any)
}

// Launcher starts an elastic job's workers as srun job steps of one
// allocation: it is the job.Launcher of `gorovod run --slurm`. Each worker is
// a one-task step (as the Provisioner's Steps mode: --exact, --export=ALL,
// the wrapper that reports its step, host and pid), placed on the node the
// job's Discovery names (Allocation.Discovery: the allocation's nodes and
// their tasks). Signals go to the step through scancel, so that the trainer,
// not srun, receives them; srun and scancel find the cluster as this
// process's environment says (SLURM_CONF, ...).
type Launcher struct {
	cfg  LauncherConfig
	logf func(format string, args ...any)
}

var _ job.Launcher = (*Launcher)(nil)

// NewLauncher checks cfg and that srun and scancel are installed.
func NewLauncher(cfg LauncherConfig) (*Launcher, error) {
	if cfg.JobID == "" || cfg.CPUsPerWorker <= 0 {
		a, ok, err := CurrentAllocation()
		if err != nil {
			return nil, err
		}
		if !ok && cfg.JobID == "" {
			return nil, errors.New("slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run under salloc or sbatch")
		}
		if cfg.JobID == "" {
			cfg.JobID = a.JobID
		}
		if cfg.CPUsPerWorker <= 0 && ok && a.JobID == cfg.JobID {
			cfg.CPUsPerWorker = a.CPUsPerTask
		}
	}
	if cfg.CPUsPerWorker <= 0 {
		cfg.CPUsPerWorker = 1
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = launch.DefaultStopGrace
	}
	for _, prog := range []string{"srun", "scancel"} {
		if _, err := exec.LookPath(prog); err != nil {
			return nil, fmt.Errorf("slurm: %w", err)
		}
	}
	l := &Launcher{cfg: cfg, logf: cfg.Logf}
	if l.logf == nil {
		l.logf = func(string, ...any) {}
	}
	return l, nil
}

// Discovery is the allocation's nodes and their tasks, as the job runner's
// hosts: it fills them in order, a.NTasks bounds the job.
func (a Allocation) Discovery() job.Discovery {
	hosts := make([]job.Host, len(a.Hosts))
	for i, h := range a.Hosts {
		hosts[i] = job.Host{Name: h.Name, Slots: h.Slots}
	}
	return job.StaticHosts(hosts...)
}

// Launch starts worker r.Index as an srun step on node r.Host and returns
// once srun runs; the step itself may start a moment later.
func (l *Launcher) Launch(ctx context.Context, r job.LaunchRequest) (job.Process, error) {
	s := &Step{l: l, index: r.Index, exitCode: -1, done: make(chan struct{})}
	output := r.Output
	if output == nil {
		output = func(string, []byte) {}
	}
	// The allocation's shape is srun's input: the step's own replaces it
	// (the last entry of a name wins).
	env := launch.ShareCPUs(l.cfg.CPUsPerWorker, 1)
	for _, name := range allocationShape {
		env = append(env, name+"=1")
	}
	env = append(env, r.Env...)
	p, err := launch.StartProcess(context.WithoutCancel(ctx), launch.ProcessSpec{
		Argv: stepArgv(l.cfg.JobID, r.Index, r.Host, l.cfg.CPUsPerWorker, l.cfg.ExtraArgs, r.Argv),
		Env:  env,
		Output: func(stream string, line []byte) {
			if s.noteLine(stream, line) {
				return
			}
			output(stream, line)
		},
		// Only the launcher's own stop (stop below) ends srun: a signal to
		// srun would end the step with SIGKILL, not reach the trainer.
		StopSignal: syscall.SIGKILL,
	})
	if err != nil {
		return nil, fmt.Errorf("slurm: starting srun for worker %d: %w", r.Index, err)
	}
	s.srun = p
	l.logf("worker %d: srun started (pid %d) on %q", r.Index, p.PID(), r.Host)
	go func() {
		select {
		case <-p.Done():
		case <-ctx.Done():
			s.stop()
		}
	}()
	go func() {
		<-p.Done()
		s.mu.Lock()
		s.err = s.exitError(p.Err())
		s.mu.Unlock()
		close(s.done)
		l.logf("worker %d (step %s) ended: %v", r.Index, s.ID(), s.Err())
	}()
	return s, nil
}

// Step is a worker running as an srun step: a job.Process.
type Step struct {
	l     *Launcher
	index int
	srun  *launch.Process
	done  chan struct{}

	mu       sync.Mutex
	id, host string
	pid      int
	exitCode int // the task's exit status as srun reported it; -1 until then
	err      error
}

var _ job.Process = (*Step)(nil)

// srunExited is srun's report of a task that exited by itself, with its
// status ("srun: error: node1: task 0: Exited with exit code 3").
var srunExited = regexp.MustCompile(`^srun: error: \S+: task 0: Exited with exit code (\d+)$`)

// noteLine takes the wrapper's marker (which it hides: it says whether line
// was it) and srun's report of the task's exit status.
func (s *Step) noteLine(stream string, line []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.host == "" {
		if id, host, pid, ok := parseMarker(stream, line); ok {
			s.id, s.host, s.pid = id, host, pid
			return true
		}
	}
	if stream == "stderr" {
		if m := srunExited.FindSubmatch(line); m != nil {
			s.exitCode, _ = strconv.Atoi(string(m[1]))
		}
	}
	return false
}

// ID is the step ("JOB.STEP"), "" until the task has started.
func (s *Step) ID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Host is the node the task runs on, "" until it has started.
func (s *Step) Host() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.host
}

// PID is the trainer's process id on its node, 0 until the task has started.
func (s *Step) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// SrunPID is the process id of the srun command on this host.
func (s *Step) SrunPID() int { return s.srun.PID() }

// Done is closed once srun has exited (the step is over) and its output is
// drained.
func (s *Step) Done() <-chan struct{} { return s.done }

// Err is, after Done, nil if the trainer exited with status 0; otherwise a
// *job.ExitError with its exit status, or the signal that ended it (srun
// exits with 128 + the signal and does not report an exit code then); or
// srun's own failure.
func (s *Step) Err() error {
	select {
	case <-s.done:
	default:
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *Step) exitError(err error) error {
	if err == nil {
		return nil
	}
	var xe *exec.ExitError
	if !errors.As(err, &xe) || xe.ExitCode() < 0 {
		return err // srun itself was killed, or could not run
	}
	code := xe.ExitCode()
	switch {
	case s.exitCode >= 0:
		return &job.ExitError{Code: s.exitCode}
	case code > 128 && code <= 128+64 && s.id != "":
		return &job.ExitError{Code: -1, Signal: syscall.Signal(code - 128)}
	}
	return fmt.Errorf("slurm: srun for worker %d: %w", s.index, err)
}

// Signal delivers sig to the trainer through `scancel --signal` (StopSignal,
// LeaveSignal, SIGKILL: scancel of a step with KILL ends it at once). Before
// the task has started there is no trainer to tell: srun is sent SIGTERM,
// which cancels the step.
func (s *Step) Signal(sig os.Signal) error {
	select {
	case <-s.done:
		return nil
	default:
	}
	id := s.ID()
	num, ok := sig.(syscall.Signal)
	if id == "" || !ok {
		return s.srun.Signal(syscall.SIGTERM)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scancel", "--signal="+strconv.Itoa(int(num)), id).CombinedOutput()
	if err != nil {
		select {
		case <-s.done:
			return nil // it ended meanwhile
		default:
		}
		return fmt.Errorf("slurm: scancel --signal=%d %s: %w: %s", int(num), id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// stop ends the step when its launch context ends: job.StopSignal, then
// SIGKILL through scancel after StopGrace, then srun itself is killed.
func (s *Step) stop() {
	for _, sig := range []syscall.Signal{job.StopSignal, syscall.SIGKILL} {
		if err := s.Signal(sig); err != nil {
			s.l.logf("worker %d: %v", s.index, err)
		}
		t := time.NewTimer(s.l.cfg.StopGrace)
		select {
		case <-s.done:
			t.Stop()
			return
		case <-t.C:
		}
	}
	s.l.logf("worker %d: step %s outlived its SIGKILL; killing srun", s.index, s.ID())
	_ = s.srun.Signal(syscall.SIGKILL)
}
