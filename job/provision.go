package job

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
)

// cluster is the autoscaling engine's view of the job through its driver.
type cluster struct{ j *Job }

func (c cluster) Remove(name string) { c.j.driver.Remove(name) }

func (c cluster) Workers() []heuristics.WorkerInfo {
	ws := c.j.driver.Workers()
	out := make([]heuristics.WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = heuristics.WorkerInfo{Name: w.Name, Host: w.Host, PID: w.PID}
	}
	return out
}

// provisioner carries out the engine's decisions with the job's launcher.
type provisioner struct{ j *Job }

// Start launches n more workers (the engine bounds n by MaxWorkers itself).
func (p provisioner) Start(ctx context.Context, n int) error { return p.j.add(ctx, n, startedByEngine) }

// Stop waits for a removed worker to exit (it does once the world moved on
// without it), then asks it to leave with LeaveSignal and finally kills it,
// giving it Config.RemoveGrace at each step.
func (p provisioner) Stop(ctx context.Context, w heuristics.WorkerInfo) error {
	j := p.j
	j.learnNames()
	ref, proc, ok := j.roster.markRemoved(w.Name)
	if !ok {
		return nil // not a process of ours (started by hand)
	}
	exited := proc.Done()
	for _, step := range []struct {
		sig  os.Signal
		wait time.Duration
	}{{nil, j.cfg.RemoveGrace}, {LeaveSignal, j.cfg.RemoveGrace}, {syscall.SIGKILL, j.cfg.RemoveGrace}} {
		if step.sig != nil {
			j.events.notice(fmt.Sprintf("worker %d (%s) did not exit; sending %v", ref.Index, w.Name, step.sig))
			if err := proc.Signal(step.sig); err != nil {
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
	return fmt.Errorf("worker %d (%s, pid %d) survived SIGKILL", ref.Index, w.Name, ref.PID)
}
