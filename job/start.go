package job

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// firstWorld is the job's start: its first world waits for all its first
// workers (Config.Workers), as Horovod starts a job with -np workers, so
// that a trainer that broadcasts before its elastic loop finds them all;
// Config.MinWorkers is the floor only once the job has started. The driver
// starts with Workers as its minimum, and run lowers it.
type firstWorld struct {
	workers, minWorkers int           // Config.Workers, Config.MinWorkers
	timeout             time.Duration // Config.StartTimeout
	roster              *roster

	formed   chan struct{} // closed at the first world
	once     sync.Once
	poke     chan struct{} // run looks again
	timedOut atomic.Bool   // the first world did not wait for all the first workers
}

func newFirstWorld(cfg Config, r *roster) *firstWorld {
	return &firstWorld{workers: cfg.Workers, minWorkers: cfg.MinWorkers, timeout: cfg.StartTimeout, roster: r,
		formed: make(chan struct{}), poke: make(chan struct{}, 1)}
}

// run lowers the driver's minimum (setMin) to Config.MinWorkers once the
// first world has formed, or at Config.StartTimeout after the first
// workers' launch (the first world then forms with those that came, and
// formedWith says so); before that, it lowers it to the first workers still
// running when some exit before they joined (there is no point waiting for
// them). Those exits also lower the voters of the first world (setFirst):
// the driver forms it only with at least half of the first workers not
// known to be gone (epoch.CheckFirstQuorum), after the start timeout too,
// as the others may be alive behind a partition, forming one of their own.
func (f *firstWorld) run(ctx context.Context, launched time.Time, setMin, setFirst func(int)) {
	timeout := time.NewTimer(time.Until(launched.Add(f.timeout)))
	defer timeout.Stop()
	need, firstVoters := f.workers, f.workers
	lower := func(n int) {
		if n < need {
			need = n
			setMin(n)
		}
	}
	timeoutC := timeout.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.formed:
			lower(f.minWorkers)
			return
		case <-timeoutC:
			f.timedOut.Store(true)
			lower(f.minWorkers)
			// Until the first world forms, first workers that exit still
			// lower its voters.
			timeoutC = nil
		case <-f.poke:
			gone := f.roster.firstGone(f.workers)
			if voters := f.workers - gone; voters < firstVoters {
				firstVoters = voters
				setFirst(voters)
			}
			lower(max(f.minWorkers, f.workers-gone))
		}
	}
}

// wake has run look again (a worker exited).
func (f *firstWorld) wake() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// formedWith notes a proposed world (on the driver's goroutine): for the
// first, it gives warn the warning for a world with fewer than
// Config.Workers members before run learns of the world.
func (f *firstWorld) formedWith(w epoch.World, warn func(string)) {
	f.once.Do(func() {
		if msg := f.short(w); msg != "" {
			warn(msg)
		}
		close(f.formed)
	})
}

// short is the warning for a first world with fewer than Config.Workers
// members, "" for one with all of them.
func (f *firstWorld) short(first epoch.World) string {
	came := len(first.Members)
	if came >= f.workers {
		return ""
	}
	why := "the others exited before they joined"
	if f.timedOut.Load() {
		why = fmt.Sprintf("the others did not join within the start timeout (%v)", f.timeout)
	}
	return fmt.Sprintf("warning: the job started with %d of its %d workers: %s; it trains with at least %d", came, f.workers, why, f.minWorkers)
}
