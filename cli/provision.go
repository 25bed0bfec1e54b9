package cli

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/launch"
)

// localProvisioner carries out the engine's decisions with worker processes
// on this host.
type localProvisioner struct {
	job     *launch.Job
	devices *devicePool   // nil without GPUs
	grace   time.Duration // a removed worker's time to exit by itself
	report  func(format string, args ...any)
}

func (p *localProvisioner) Start(ctx context.Context, n int) error {
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		i, err := p.job.Add()
		if err != nil {
			return err
		}
		p.devices.releaseWhenDone(i, p.job.Exited(i))
		p.report("worker %d pid %d started", i, p.job.PIDs()[i])
	}
	return nil
}

// Stop waits for a removed worker to exit (it does once the world moved on
// without it), then asks it to leave with SIGTERM and finally kills it.
func (p *localProvisioner) Stop(ctx context.Context, w heuristics.WorkerInfo) error {
	i := -1
	for j, pid := range p.job.PIDs() {
		if pid == w.PID && pid != 0 {
			i = j
		}
	}
	if i < 0 {
		return nil // not a process of ours (started by hand)
	}
	exited := p.job.Exited(i)
	for _, step := range []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{0, p.grace}, {syscall.SIGTERM, p.grace}, {syscall.SIGKILL, p.grace}} {
		if step.sig != 0 {
			p.report("worker %d (%s) did not exit; sending %v", i, w.Name, step.sig)
			if err := p.job.SignalWorker(i, step.sig); err != nil {
				return err
			}
		}
		t := time.NewTimer(step.wait)
		select {
		case <-exited:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return fmt.Errorf("worker %d (%s, pid %d) survived SIGKILL", i, w.Name, w.PID)
}
