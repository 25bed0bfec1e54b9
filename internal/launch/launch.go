// Package launch starts a job's worker processes on this host: it runs the
// rendezvous the workers find each other through, hands each its rank, job id
// and secret in the environment, routes every line they print through one
// callback, and stops them all on cancellation. `gorovod bench` and `gorovod run`
// launch through it.
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
	Argv  []string // the worker command
	NP    int      // number of workers
	JobID string   // default: a random id
	Env   []string // extra NAME=value entries
	// Output receives every line a worker prints (stream is "stdout" or
	// "stderr"). Default: "[rank] line" to this process's stdout / stderr.
	Output func(rank int, stream string, line []byte)
	// StopGrace is how long workers get between SIGTERM and SIGKILL when the job
	// is cancelled. Default 5 s.
	StopGrace time.Duration
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
	spec  Spec
	rdv   *rendezvous.Server
	procs []*exec.Cmd
	errs  []error
	done  chan struct{}
}

// ExitError is a worker that failed.
type ExitError struct {
	Rank int
	Err  error
}

func (e *ExitError) Error() string { return fmt.Sprintf("worker rank %d: %v", e.Rank, e.Err) }
func (e *ExitError) Unwrap() error { return e.Err }

// NewSecret returns a fresh random job secret.
func NewSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return b
}

// Start launches the workers. Cancelling ctx stops them (SIGTERM, then SIGKILL
// after StopGrace).
func Start(ctx context.Context, spec Spec) (*Job, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("launch: no worker command")
	}
	if spec.NP < 1 {
		return nil, fmt.Errorf("launch: --np %d must be at least 1", spec.NP)
	}
	if spec.JobID == "" {
		spec.JobID = fmt.Sprintf("job-%x", NewSecret()[:6])
	}
	if spec.StopGrace <= 0 {
		spec.StopGrace = 5 * time.Second
	}
	if spec.Output == nil {
		spec.Output = defaultOutput
	}
	if spec.CPUs <= 0 {
		spec.CPUs = runtime.NumCPU()
	}
	var shareCPUs []string
	if !slices.ContainsFunc(append(os.Environ(), spec.Env...), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") }) {
		shareCPUs = []string{fmt.Sprintf("GOMAXPROCS=%d", max(1, spec.CPUs/spec.NP))}
	}
	rdv, err := rendezvous.Listen("127.0.0.1:0", spec.NP)
	if err != nil {
		return nil, err
	}
	j := &Job{spec: spec, rdv: rdv, errs: make([]error, spec.NP), done: make(chan struct{})}
	secret := NewSecret()
	for rank := range spec.NP {
		w := envconfig.Worker{JobID: spec.JobID, Rank: rank, Size: spec.NP, Secret: secret, Rendezvous: rdv.Addr()}
		cmd := exec.CommandContext(ctx, spec.Argv[0], spec.Argv[1:]...)
		cmd.Env = slices.Concat(os.Environ(), shareCPUs, spec.Env, w.Environ())
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = spec.StopGrace
		// exec copies the output and Wait waits for the copy to finish, so no
		// line printed just before exit is lost.
		cmd.Stdout = &lineWriter{rank: rank, stream: "stdout", out: spec.Output}
		cmd.Stderr = &lineWriter{rank: rank, stream: "stderr", out: spec.Output}
		if err := cmd.Start(); err != nil {
			j.kill()
			return nil, fmt.Errorf("launch: starting rank %d: %w", rank, err)
		}
		j.procs = append(j.procs, cmd)
	}
	go j.wait()
	return j, nil
}

// JobID is the launched job's id.
func (j *Job) JobID() string { return j.spec.JobID }

// PIDs returns the workers' process ids by rank.
func (j *Job) PIDs() []int {
	pids := make([]int, len(j.procs))
	for i, p := range j.procs {
		pids[i] = p.Process.Pid
	}
	return pids
}

// Signal sends sig to every worker.
func (j *Job) Signal(sig os.Signal) {
	for _, p := range j.procs {
		_ = p.Process.Signal(sig)
	}
}

func (j *Job) kill() {
	for _, p := range j.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	_ = j.rdv.Close()
}

// lineWriter hands complete lines to out; a line longer than maxLine is cut.
type lineWriter struct {
	rank   int
	stream string
	out    func(rank int, stream string, line []byte)
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
		w.out(w.rank, w.stream, w.buf[:i])
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
		w.out(w.rank, w.stream, w.buf)
		w.buf = nil
	}
}

func (j *Job) wait() {
	var wg sync.WaitGroup
	for rank, p := range j.procs {
		wg.Go(func() {
			err := p.Wait()
			p.Stdout.(*lineWriter).flush()
			p.Stderr.(*lineWriter).flush()
			if err != nil {
				j.errs[rank] = &ExitError{Rank: rank, Err: err}
			}
		})
	}
	wg.Wait()
	_ = j.rdv.Close()
	close(j.done)
}

// Done is closed once every worker has exited and its output is drained.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for every worker and returns the failures, one *ExitError per
// failed rank, joined.
func (j *Job) Wait() error {
	<-j.done
	return errors.Join(j.errs...)
}

func defaultOutput(rank int, stream string, line []byte) {
	w := os.Stdout
	if stream == "stderr" {
		w = os.Stderr
	}
	fmt.Fprintf(w, "[%d] %s\n", rank, line)
}
