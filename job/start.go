package job

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
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
	limit               time.Duration // Config.ElasticTimeout: the wait for joiners after timeout
	roster              *roster

	formed   chan struct{} // closed at the first world
	once     sync.Once
	poke     chan struct{}              // run looks again
	timedOut atomic.Bool                // the first world did not wait for all the first workers
	failed   atomic.Pointer[StartError] // the job gave up: no world formed
}

func newFirstWorld(cfg Config, r *roster) *firstWorld {
	return &firstWorld{workers: cfg.Workers, minWorkers: cfg.MinWorkers, timeout: cfg.StartTimeout, limit: cfg.ElasticTimeout, roster: r,
		formed: make(chan struct{}), poke: make(chan struct{}, 1)}
}

// startHooks are what firstWorld.run acts through.
type startHooks struct {
	setMin, setFirst func(int) // the driver's minimum and the first world's voters
	// joined lists the workers in the driver's view: the first world
	// forms from those.
	joined func() []driver.WorkerInfo
	warn   func(string)
	// giveUp ends the job, which no world formed (failed holds why).
	giveUp func(*StartError)
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
//
// At the start timeout, when too few workers have joined to form the first
// world (fewer than the minimum, or than half its voters), it warns, naming
// the processes that have not joined; Config.ElasticTimeout later, if the
// world has still not formed, the job gives up (a *StartError): workers
// that never join (paused with SIGSTOP, hung before they reach the job)
// must not hold it without end.
func (f *firstWorld) run(ctx context.Context, launched time.Time, h startHooks) {
	timeout := time.NewTimer(time.Until(launched.Add(f.timeout)))
	defer timeout.Stop()
	need, firstVoters := f.workers, f.workers
	lower := func(n int) {
		if n < need {
			need = n
			h.setMin(n)
		}
	}
	timeoutC := timeout.C
	var limitC <-chan time.Time
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
			limitC = time.After(time.Until(launched.Add(f.timeout + f.limit)))
			if e := f.startError(h.joined(), firstVoters, time.Since(launched)); e.Joined < e.Needed {
				h.warn(fmt.Sprintf("warning: %v; the job fails if the world has not formed %v from now (--elastic-timeout)", e, f.limit))
			}
		case <-limitC:
			select {
			case <-f.formed: // just now: both were ready
				lower(f.minWorkers)
				return
			default:
			}
			e := f.startError(h.joined(), firstVoters, time.Since(launched))
			f.failed.Store(e)
			h.giveUp(e)
			return
		case <-f.poke:
			gone := f.roster.firstGone(f.workers)
			if voters := f.workers - gone; voters < firstVoters {
				firstVoters = voters
				h.setFirst(voters)
			}
			lower(max(f.minWorkers, f.workers-gone))
		}
	}
}

// startError describes a first world not formed after waited, with the
// workers in ws joined and voters its voters: it needs the minimum, and
// half of its voters (epoch.CheckFirstQuorum, the driver proposing).
func (f *firstWorld) startError(ws []driver.WorkerInfo, voters int, waited time.Duration) *StartError {
	return &StartError{Waited: waited, Joined: len(ws), Needed: max(f.minWorkers, (voters+1)/2), NotJoined: f.roster.notJoined(ws)}
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

// StartError is a job whose first world never formed: Config.StartTimeout
// plus Config.ElasticTimeout after its workers' launch, too few had joined.
type StartError struct {
	Waited time.Duration `json:"waited"` // since the workers' launch
	Joined int           `json:"joined"` // workers in the driver's view
	Needed int           `json:"needed"` // the first world's least size
	// NotJoined are the job's running processes that had not joined.
	NotJoined []WorkerRef `json:"not_joined,omitempty"`
}

func (e *StartError) Error() string {
	msg := fmt.Sprintf("no world formed %v after the workers' launch: %d of the %d workers it needs joined",
		e.Waited.Round(time.Millisecond), e.Joined, e.Needed)
	if len(e.NotJoined) == 0 {
		return msg
	}
	names := make([]string, len(e.NotJoined))
	for i, w := range e.NotJoined {
		names[i] = w.String()
	}
	return fmt.Sprintf("%s; not joined (paused, hung, or stuck before it reached the job): %s", msg, strings.Join(names, ", "))
}
