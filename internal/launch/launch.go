// Package launch runs a job's worker processes on this host: it starts them with
// the environment the caller gives each, routes every line they print through
// one callback, adds workers while the job runs, and stops them all on
// cancellation. `gorovod bench` and `gorovod run` launch through it.
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
	"github.com/gorovod/gorovod/internal/rendezvous"
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
	// CPUs is how many CPUs the workers share; each gets GOMAXPROCS =
	// max(1, CPUs/NP) unless the environment already sets GOMAXPROCS. Several
	// Go runtimes each sized for the whole machine spin and hand goroutines
	// between threads for nothing (measured: 2 workers on 2 cores move 16 MiB
	// allreduces 30 % faster with GOMAXPROCS=1), as torchrun sets
	// OMP_NUM_THREADS=1 for the same reason. Default runtime.NumCPU().
	CPUs int
}

// Job is a running set of workers.
type Job struct {
	ctx       context.Context
	spec      Spec
	shareCPUs []string

	mu      sync.Mutex
	procs   []*exec.Cmd
	exited  []chan struct{} // closed when worker i has exited
	errs    []error
	running int  // workers not exited yet
	ended   bool // every worker has exited; no more can be added
	done    chan struct{}
}

// ExitError is a worker that failed.
type ExitError struct {
	Worker int
	Err    error
}

func (e *ExitError) Error() string { return fmt.Sprintf("worker %d: %v", e.Worker, e.Err) }
func (e *ExitError) Unwrap() error { return e.Err }

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
		spec.StopGrace = 5 * time.Second
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
	if spec.Environ == nil {
		spec.Environ = os.Environ()
	}
	j := &Job{ctx: ctx, spec: spec, done: make(chan struct{})}
	if !slices.ContainsFunc(spec.Environ, func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") }) {
		j.shareCPUs = []string{fmt.Sprintf("GOMAXPROCS=%d", max(1, spec.CPUs/spec.NP))}
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

// Add starts one more worker and returns its index.
func (j *Job) Add() (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ended {
		return 0, errors.New("launch: the job has ended")
	}
	i := len(j.procs)
	cmd := exec.CommandContext(j.ctx, j.spec.Argv[0], j.spec.Argv[1:]...)
	cmd.Env = slices.Concat(j.spec.Environ, j.shareCPUs, j.spec.Env(i))
	cmd.Cancel = func() error { return cmd.Process.Signal(j.spec.StopSignal) }
	cmd.WaitDelay = j.spec.StopGrace
	// exec copies the output and Wait waits for the copy to finish, so no
	// line printed just before exit is lost.
	stdout := &lineWriter{worker: i, stream: "stdout", out: j.spec.Output}
	stderr := &lineWriter{worker: i, stream: "stderr", out: j.spec.Output}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		if j.running == 0 {
			j.ended = true
			close(j.done)
		}
		return 0, fmt.Errorf("launch: starting worker %d: %w", i, err)
	}
	j.procs = append(j.procs, cmd)
	j.errs = append(j.errs, nil)
	exited := make(chan struct{})
	j.exited = append(j.exited, exited)
	j.running++
	go func() {
		err := cmd.Wait()
		stdout.flush()
		stderr.flush()
		j.mu.Lock()
		defer j.mu.Unlock()
		if err != nil {
			j.errs[i] = &ExitError{Worker: i, Err: err}
		}
		close(exited)
		if j.running--; j.running == 0 {
			j.ended = true
			close(j.done)
		}
	}()
	return i, nil
}

// PIDs returns the workers' process ids by index.
func (j *Job) PIDs() []int {
	j.mu.Lock()
	defer j.mu.Unlock()
	pids := make([]int, len(j.procs))
	for i, p := range j.procs {
		pids[i] = p.Process.Pid
	}
	return pids
}

// Signal sends sig to every worker.
func (j *Job) Signal(sig os.Signal) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range j.procs {
		_ = p.Process.Signal(sig)
	}
}

// SignalWorker sends sig to worker i (an index Add returned).
func (j *Job) SignalWorker(i int, sig os.Signal) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.procs) {
		return fmt.Errorf("launch: no worker %d", i)
	}
	return j.procs[i].Process.Signal(sig)
}

// Exited is closed once worker i has exited (nil for an unknown index).
func (j *Job) Exited(i int) <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	if i < 0 || i >= len(j.exited) {
		return nil
	}
	return j.exited[i]
}

// Done is closed once every worker has exited and its output is drained.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for every worker and returns the failures, one *ExitError per
// failed worker, joined.
func (j *Job) Wait() error {
	<-j.done
	return errors.Join(j.Errors()...)
}

// Errors returns each worker's exit error (nil for success or still running).
func (j *Job) Errors() []error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.errs)
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
// secret and the server's address. Call stop when the job has ended.
func FixedWorld(jobID string, np int) (env func(i int) []string, stop func(), err error) {
	rdv, err := rendezvous.Listen("127.0.0.1:0", np)
	if err != nil {
		return nil, nil, err
	}
	secret := NewSecret()
	env = func(i int) []string {
		w := envconfig.Worker{JobID: jobID, Rank: i, Size: np, Secret: secret, Rendezvous: rdv.Addr()}
		return w.Environ()
	}
	return env, func() { _ = rdv.Close() }, nil
}
