package job

import (
	"context"
	"fmt"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// The job's start: its first world waits for all its first workers
// (Config.Workers), as Horovod starts a job with -np workers, so that a
// trainer that broadcasts before its elastic loop finds them all;
// Config.MinWorkers is the floor only once the job has started. The driver
// starts with Workers as its minimum, and awaitFirstWorld lowers it.

// awaitFirstWorld lowers the driver's minimum to Config.MinWorkers once
// the first world has formed, or at Config.StartTimeout after the first
// workers' launch (the first world then forms with those that came, and
// onEpoch says so); before that, it lowers it to the first workers still
// running when some exit before they joined (there is no point waiting
// for them).
func (j *Job) awaitFirstWorld(ctx context.Context, launched time.Time) {
	timeout := time.NewTimer(time.Until(launched.Add(j.cfg.StartTimeout)))
	defer timeout.Stop()
	need := j.cfg.Workers
	lower := func(n int) {
		if n < need {
			need = n
			j.driver.SetMinWorkers(n)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-j.firstWorld:
			lower(j.cfg.MinWorkers)
			return
		case <-timeout.C:
			j.mu.Lock()
			j.startTimedOut = true
			j.mu.Unlock()
			lower(j.cfg.MinWorkers)
			return
		case <-j.firstPoke:
			lower(max(j.cfg.MinWorkers, j.cfg.Workers-j.firstGone()))
		}
	}
}

// firstGone counts the first workers (launch indexes below Config.Workers)
// that have exited.
func (j *Job) firstGone() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, p := range j.procs[:min(len(j.procs), j.cfg.Workers)] {
		if p == nil || p.rec.State != Running {
			n++
		}
	}
	return n
}

// pokeFirst has awaitFirstWorld look again (a worker exited).
func (j *Job) pokeFirst() {
	select {
	case j.firstPoke <- struct{}{}:
	default:
	}
}

// startedShort is the warning for a first world with fewer than
// Config.Workers members, "" for one with all of them. Called on the
// driver's goroutine, for the first world.
func (j *Job) startedShort(first epoch.World) string {
	came := len(first.Members)
	if came >= j.cfg.Workers {
		return ""
	}
	j.mu.Lock()
	timedOut := j.startTimedOut
	j.mu.Unlock()
	why := "the others exited before they joined"
	if timedOut {
		why = fmt.Sprintf("the others did not join within the start timeout (%v)", j.cfg.StartTimeout)
	}
	return fmt.Sprintf("warning: the job started with %d of its %d workers: %s; it trains with at least %d", came, j.cfg.Workers, why, j.cfg.MinWorkers)
}
