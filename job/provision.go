package job

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job/launch"
)

// cluster is the autoscaling engine's view of the job through its driver.
type cluster struct{ j *Job }

// Remove takes worker name out of the job for good. Its process is marked
// removed before the driver leaves it out: the job's goroutine that follows
// the worlds (followMembers) may see the world without it before the engine's
// does, and must not count a scale-down as the worker being left out of a
// world (it would be reported as excluded, "declared failed while paused or
// cut off", at the end of the job).
func (c cluster) Remove(name string) {
	c.j.learnNames()
	c.j.roster.markRemoved(name)
	c.j.driver.Remove(name)
}

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
	return j.signalUntilExit(ctx, ref, w.Name, "", proc,
		[]stopStep{{nil, j.cfg.RemoveGrace}, {LeaveSignal, j.cfg.RemoveGrace}, {syscall.SIGKILL, j.cfg.RemoveGrace}})
}

// stopStep is one rung of signalUntilExit's ladder: a signal (none: only
// wait) and how long the process then has to exit.
type stopStep struct {
	sig  os.Signal
	wait time.Duration
}

// signalUntilExit takes worker ref (name; label follows the name in the
// notices) down steps until it exits: each step's signal, then its wait.
// Every signal but a first step's is noticed as the worker not having
// exited. It fails if the worker outlives the last step, or ctx ends.
func (j *Job) signalUntilExit(ctx context.Context, ref WorkerRef, name, label string, proc Process, steps []stopStep) error {
	exited := proc.Done()
	for i, step := range steps {
		if step.sig != nil {
			if i > 0 {
				j.events.notice(fmt.Sprintf("worker %d (%s)%s did not exit; sending %s", ref.Index, name, label, signalName(step.sig)))
			}
			if err := launch.SignalAwake(proc, step.sig); err != nil {
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
	return fmt.Errorf("worker %d (%s, pid %d) survived %s", ref.Index, name, ref.PID, signalName(steps[len(steps)-1].sig))
}

// signalName is sig as the notices name it: SIGKILL rather than "killed".
func signalName(sig os.Signal) string {
	if s, ok := sig.(syscall.Signal); ok {
		if name := unix.SignalName(s); name != "" {
			return name
		}
	}
	return sig.String()
}
