package launch

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/rendezvous"
)

// Spec describes a job to launch.
type Spec struct {
	Argv []string // the worker command
	NP   int      // workers started at once
	// Env returns the extra NAME=value entries of worker i (added after
	// Environ).
	Env func(i int) []string
	// Environ is the environment every worker starts from. Default: this
	// process's.
	Environ []string
	// Output receives every line a worker prints (stream is "stdout" or
	// "stderr"). Default: "[i] line" to this process's stdout / stderr.
	Output func(i int, stream string, line []byte)
	// StopSignal is sent to every worker when the job is cancelled; SIGKILL
	// follows after StopGrace. Default SIGTERM.
	StopSignal syscall.Signal
	StopGrace  time.Duration
	// CPUs is how many CPUs the workers share; each gets GOMAXPROCS and
	// OMP_NUM_THREADS = max(1, CPUs/NP), each unless the environment
	// already sets it (see ShareCPUs). Default runtime.NumCPU().
	CPUs int

	// Host places worker i (Start's first NP workers, and Add's): "" or a
	// name IsLocal accepts runs it here as a child process, any other name
	// starts it on that host over SSH. Default: every worker here.
	Host func(i int) string
	// HostSlots is how many workers share a remote host's CPUs: a remote
	// worker gets GOMAXPROCS and OMP_NUM_THREADS = max(1, the host's CPUs /
	// slots), each unless its environment sets it. Default 1.
	HostSlots func(host string) int
	// SSH is how workers on other hosts are started.
	SSH SSH
	// Placement pins workers to CPUs (PlaceBalanced: each to its share of
	// the first CPUs of those this process may use). Default PlaceAnywhere.
	Placement Placement
}

// Job is a running set of workers.
type Job struct {
	ctx       context.Context
	spec      Spec
	shareCPUs []string
	cpus      []int // the CPUs PlaceBalanced shares out; nil: no pinning

	mu      sync.Mutex
	workers []*worker
	running int  // workers not exited yet
	ended   bool // every worker has exited; no more can be added
	done    chan struct{}
}

// worker is one launched process: a child of this process, or an ssh client
// whose remote end runs the worker (remote != nil).
type worker struct {
	cmd    *exec.Cmd
	host   string // "" for this host
	remote *remoteWorker
	exited chan struct{} // closed when the worker has exited
	err    error
}

// WorkerError is a worker that failed: which one (its index in the job)
// and why, an *exec.ExitError, a *RemoteExit or a *HostError. It is not an
// exit status of its own (package job's ExitError is that, for launchers
// that do not use os/exec), hence the different name.
type WorkerError struct {
	Worker int
	Err    error
}

func (e *WorkerError) Error() string { return fmt.Sprintf("worker %d: %v", e.Worker, e.Err) }
func (e *WorkerError) Unwrap() error { return e.Err }

// NewSecret returns a fresh random job secret.
func NewSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return b
}

// NewJobID returns a fresh job id.
func NewJobID() string { return fmt.Sprintf("job-%x", NewSecret()[:6]) }

// Start launches the first spec.NP workers. Cancelling ctx stops them all
// (SIGTERM, then SIGKILL after StopGrace).
func Start(ctx context.Context, spec Spec) (*Job, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("launch: no worker command")
	}
	if spec.NP < 1 {
		return nil, fmt.Errorf("launch: --np %d must be at least 1", spec.NP)
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = DefaultStopGrace
	}
	if spec.StopSignal == 0 {
		spec.StopSignal = syscall.SIGTERM
	}
	if spec.Output == nil {
		spec.Output = defaultOutput
	}
	if spec.Env == nil {
		spec.Env = func(int) []string { return nil }
	}
	if spec.CPUs <= 0 {
		spec.CPUs = runtime.NumCPU()
	}
	if spec.Host == nil {
		spec.Host = func(int) string { return "" }
	}
	if spec.HostSlots == nil {
		spec.HostSlots = func(string) int { return 1 }
	}
	var err error
	if spec.SSH, err = spec.SSH.withDefaults(); err != nil {
		return nil, err
	}
	place, err := ParsePlacement(string(spec.Placement))
	if err != nil {
		return nil, err
	}
	if spec.Environ == nil {
		spec.Environ = os.Environ()
	}
	j := &Job{ctx: ctx, spec: spec, done: make(chan struct{}), shareCPUs: shareCPUsIn(spec.Environ, spec.CPUs, spec.NP)}
	if place == PlaceBalanced {
		cpus, err := allowedCPUs()
		if err != nil {
			return nil, err
		}
		j.cpus = cpus[:min(len(cpus), spec.CPUs)]
	}
	for range spec.NP {
		if _, err := j.Add(); err != nil {
			j.Signal(syscall.SIGKILL)
			<-j.done
			return nil, err
		}
	}
	return j, nil
}

// Add starts one more worker where Spec.Host places it and returns its index.
func (j *Job) Add() (int, error) { return j.add(j.spec.Host, nil) }

// AddOn starts one more worker on host ("" or a local name: here, as a child
// process; otherwise over SSH) with env added to Spec.Env's entries, and
// returns its index. A remote worker's start is asynchronous: AddOn returns
// once ssh runs, and a host that cannot be reached or refuses shows as the
// worker's exit with a *HostError, within SSH.StartTimeout.
func (j *Job) AddOn(host string, env ...string) (int, error) {
	return j.add(func(int) string { return host }, env)
}

// add starts worker i = the next index on place(i).
func (j *Job) add(place func(i int) string, env []string) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ended {
		return 0, errors.New("launch: the job has ended")
	}
	i := len(j.workers)
	host := place(i)
	w := &worker{exited: make(chan struct{})}
	// exec copies the output and Wait waits for the copy to finish, so no
	// line printed just before exit is lost.
	stdout := &lineWriter{worker: i, stream: "stdout", out: j.spec.Output}
	stderr := &lineWriter{worker: i, stream: "stderr", out: j.spec.Output}
	var err error
	if IsLocal(host) {
		w.cmd = exec.CommandContext(j.ctx, j.spec.Argv[0], j.spec.Argv[1:]...)
		w.cmd.Env = slices.Concat(j.spec.Environ, j.shareCPUs, j.spec.Env(i), env)
		w.cmd.Cancel = func() error { return SignalAwake(w.cmd.Process, j.spec.StopSignal) }
		w.cmd.WaitDelay = j.spec.StopGrace
		w.cmd.Stdout, w.cmd.Stderr = stdout, stderr
		var cpus []int
		if j.cpus != nil {
			cpus = balancedCPUs(i, j.spec.NP, j.cpus)
		}
		err = startOn(w.cmd, cpus)
	} else {
		w.host = host
		err = j.startRemote(w, slices.Concat(j.spec.Env(i), env), stdout, stderr)
	}
	if err != nil {
		if j.running == 0 {
			j.ended = true
			close(j.done)
		}
		if w.host != "" {
			return 0, fmt.Errorf("launch: starting worker %d on %s: %w", i, w.host, err)
		}
		return 0, fmt.Errorf("launch: starting worker %d: %w", i, err)
	}
	j.workers = append(j.workers, w)
	j.running++
	go func() {
		err := w.cmd.Wait()
		stdout.flush()
		stderr.flush()
		if w.remote != nil {
			err = w.remote.outcome(err)
		}
		j.mu.Lock()
		defer j.mu.Unlock()
		if err != nil {
			w.err = &WorkerError{Worker: i, Err: err}
		}
		close(w.exited)
		if j.running--; j.running == 0 {
			j.ended = true
			close(j.done)
		}
	}()
	return i, nil
}

// ProcessSpec describes one worker process.
type ProcessSpec struct {
	Argv []string
	// Env holds NAME=value entries added after this process's environment.
	Env []string
	// Output receives every line the process prints (stream is "stdout" or
	// "stderr"), also a last line without a newline; the line is valid only
	// during the call. Default: discarded.
	Output func(stream string, line []byte)
	// StopSignal is sent when the context given to StartProcess ends; SIGKILL
	// follows after StopGrace. Defaults SIGTERM and 5 s.
	StopSignal syscall.Signal
	StopGrace  time.Duration
	// CPUs pins the process to these CPUs (see Placement and PlaceCPUs);
	// nil lets it run anywhere.
	CPUs []int
	// OutputFiles, when set, is a path prefix: the process writes its
	// stdout to OutputFiles+".stdout" and its stderr to
	// OutputFiles+".stderr" itself (created mode 0600, appended to), and
	// Output receives their lines as the files grow. Unlike a pipe, whose
	// writer dies of SIGPIPE (or gets EPIPE) once its reader has gone, a
	// file keeps the process's output and the process alive when this
	// process dies. Default: pipes to this process.
	OutputFiles string
}

// DefaultStopGrace is how long a process stopped by its context has to exit
// before it is killed.
const DefaultStopGrace = 5 * time.Second

// Process is one running worker process.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// StartProcess starts one process. When ctx ends it is sent spec.StopSignal,
// then SIGKILL after spec.StopGrace.
func StartProcess(ctx context.Context, spec ProcessSpec) (*Process, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("launch: no worker command")
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = DefaultStopGrace
	}
	if spec.StopSignal == 0 {
		spec.StopSignal = syscall.SIGTERM
	}
	if spec.Output == nil {
		spec.Output = func(string, []byte) {}
	}
	cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = slices.Concat(os.Environ(), spec.Env)
	cmd.Cancel = func() error { return SignalAwake(cmd.Process, spec.StopSignal) }
	cmd.WaitDelay = spec.StopGrace
	// exec copies the output and Wait waits for the copy to finish, so no
	// line printed just before exit is lost.
	out := func(_ int, stream string, line []byte) { spec.Output(stream, line) }
	stdout := &lineWriter{stream: "stdout", out: out}
	stderr := &lineWriter{stream: "stderr", out: out}
	var files *outputFiles
	if spec.OutputFiles != "" {
		var err error
		if files, err = openOutputFiles(spec.OutputFiles, stdout, stderr); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = files.stdout.w, files.stderr.w
	} else {
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}
	err := startOn(cmd, spec.CPUs)
	if files != nil {
		files.closeWriters() // the child holds its own copies
	}
	if err != nil {
		if files != nil {
			files.close()
		}
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	exited := make(chan struct{})
	if files != nil {
		go files.follow(exited)
	}
	go func() {
		err := cmd.Wait()
		if files != nil {
			close(exited)
			<-files.drained
		}
		stdout.flush()
		stderr.flush()
		p.err = err
		close(p.done)
	}()
	return p, nil
}

// SignalAwake sends p sig, then SIGCONT (not after SIGKILL or SIGCONT
// itself). A paused process (SIGSTOP, a terminal's ^Z, a debugger) gets sig
// only once it runs again: without the SIGCONT, a worker paused when it is
// stopped or asked to leave would do neither, and be killed after its
// grace without the lines it had yet to write or the graceful leave it was
// asked for (the shim of a remote worker does the same: controlLoop). A
// running process ignores SIGCONT. The error is sig's alone: SIGCONT fails
// only for a process that has exited since, and os/exec would take that
// error from a Cancel for a process that had exited before the stop.
func SignalAwake(p interface{ Signal(os.Signal) error }, sig os.Signal) error {
	if err := p.Signal(sig); err != nil {
		return err
	}
	if sig != syscall.SIGKILL && sig != syscall.SIGCONT {
		_ = p.Signal(syscall.SIGCONT)
	}
	return nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Done is closed once the process has exited and its output is drained.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is, once Done is closed, nil if the process exited with status 0, and
// otherwise why it did not (an *exec.ExitError for an exit status or a
// signal). Before that it is nil.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// ShareCPUs returns the environment entries that give each of n processes
// sharing cpus CPUs its share, max(1, cpus/n): GOMAXPROCS for the Go runtime
// and OMP_NUM_THREADS for a framework's compute threads (OpenMP, and
// OpenBLAS, whose own thread pool torch.set_num_threads does not bound), each
// left out when this process's environment already sets it (the workers
// inherit it). Several Go runtimes each sized for the whole machine spin and
// hand goroutines between threads for nothing (measured: 2 workers on 2 cores
// move 16 MiB allreduces 30 % faster with GOMAXPROCS=1); torchrun sets
// OMP_NUM_THREADS=1 for the same reason (measured: 2 PyTorch workers on 2
// cores spend 30-50 % less CPU per training step with one OpenBLAS thread
// each than with OpenBLAS's default of one per core, whose idle threads spin
// in sched_yield).
func ShareCPUs(cpus, n int) []string { return shareCPUsIn(os.Environ(), cpus, n) }

// shareCPUsIn is ShareCPUs for workers whose environment starts as environ.
func shareCPUsIn(environ []string, cpus, n int) []string {
	share := max(1, cpus/max(1, n))
	var env []string
	for _, name := range []string{"GOMAXPROCS", "OMP_NUM_THREADS"} {
		if !slices.ContainsFunc(environ, func(kv string) bool { return strings.HasPrefix(kv, name+"=") }) {
			env = append(env, fmt.Sprintf("%s=%d", name, share))
		}
	}
	return env
}

// PIDs returns the workers' process ids by index, each on its own host (see
// Host): a remote worker's is its pid there, 0 until it has started.
func (j *Job) PIDs() []int {
	j.mu.Lock()
	defer j.mu.Unlock()
	pids := make([]int, len(j.workers))
	for i, w := range j.workers {
		if w.remote != nil {
			pids[i] = w.remote.pid()
		} else {
			pids[i] = w.cmd.Process.Pid
		}
	}
	return pids
}

// Host returns where worker i runs ("" for this host).
func (j *Job) Host(i int) string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.workers) {
		return ""
	}
	return j.workers[i].host
}

// Signal sends sig to every worker.
func (j *Job) Signal(sig os.Signal) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, w := range j.workers {
		_ = w.signal(sig)
	}
}

// SignalWorker sends sig to worker i (an index Add returned). A remote worker
// gets it through its ssh connection; it is delivered once the worker has
// started.
func (j *Job) SignalWorker(i int, sig os.Signal) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.workers) {
		return fmt.Errorf("launch: no worker %d", i)
	}
	return j.workers[i].signal(sig)
}

func (w *worker) signal(sig os.Signal) error {
	if w.remote != nil {
		return w.remote.signal(sig)
	}
	return w.cmd.Process.Signal(sig)
}

// Exited is closed once worker i has exited (nil for an unknown index).
func (j *Job) Exited(i int) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.workers) {
		return nil
	}
	return j.workers[i].exited
}

// Done is closed once every worker has exited and its output is drained.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for every worker and returns the failures, one *WorkerError per
// failed worker, joined.
func (j *Job) Wait() error {
	<-j.done
	return errors.Join(j.Errors()...)
}

// Errors returns each worker's exit error (nil for success or still running).
func (j *Job) Errors() []error {
	j.mu.Lock()
	defer j.mu.Unlock()
	errs := make([]error, len(j.workers))
	for i, w := range j.workers {
		errs[i] = w.err
	}
	return errs
}

// lineWriter hands complete lines to out; a line longer than maxLine is cut.
type lineWriter struct {
	worker int
	stream string
	out    func(i int, stream string, line []byte)
	buf    []byte
}

const maxLine = 1 << 20

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.out(w.worker, w.stream, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > maxLine {
		w.flush()
	}
	return len(p), nil
}

// flush emits a last line that had no newline.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.out(w.worker, w.stream, w.buf)
		w.buf = nil
	}
}

func defaultOutput(i int, stream string, line []byte) {
	w := os.Stdout
	if stream == "stderr" {
		w = os.Stderr
	}
	fmt.Fprintf(w, "[%d] %s\n", i, line)
}

// FixedWorld prepares a fixed-size job of np workers that find each other
// through a rendezvous server: Env gives worker i rank i, the job id, a fresh
// secret and the server's address. The server takes only joins signed with
// the secret (rendezvous.JoinSecret). Call stop when the job has ended.
func FixedWorld(jobID string, np int) (env func(i int) []string, stop func(), err error) {
	secret := NewSecret()
	cfg := rendezvous.DefaultConfig(np)
	cfg.Secret = secret
	rdv, err := rendezvous.ListenConfig("127.0.0.1:0", cfg)
	if err != nil {
		return nil, nil, err
	}
	env = func(i int) []string {
		w := envconfig.Worker{JobID: jobID, Rank: i, Size: np, Secret: secret, Rendezvous: rdv.Addr()}
		return w.Environ()
	}
	return env, func() { _ = rdv.Close() }, nil
}
