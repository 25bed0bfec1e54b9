package spin

import (
	"context"
	"runtime"
	"time"
)

// minFraction is the floor of an adapted limit, as a fraction of the maximum:
// a limit that fell to nothing could never learn that polling pays again.
const minFraction = 16

// slowYield is how long a sched_yield may take before it counts as having
// handed the CPU to a process that is not waiting for anything: a rank of the
// same job sharing the core gives it back within tens of microseconds (it
// soon waits itself), a busy process keeps it for a whole time slice
// (0.75–3 ms). The Budget then stops yielding to other processes for
// yieldPause, doubled each time the next yield is slow again, up to
// maxYieldPause: a few lost slices, where yielding on every wait would lose
// one per wait (measured with one core kept busy: a 4 KiB allreduce took
// 1.7–3.4 ms instead of 3–40 µs).
const (
	slowYield     = 200 * time.Microsecond
	yieldPause    = 100 * time.Millisecond
	maxYieldPause = 10 * time.Second
)

// Budget bounds the polling of one direction of a link and adapts the bound to
// how long that direction's waits last. The zero Budget never polls. It is
// used by one call at a time (under the direction's lock).
type Budget struct {
	max   time.Duration
	limit time.Duration
	every int
	// yield: polls also yield to other processes (sched_yield). Until
	// noYieldUntil they do not: a yield found a process that keeps the CPU
	// (the last at lastSlow, which stopped them for pause).
	yield        bool
	noYieldUntil time.Time
	lastSlow     time.Time
	pause        time.Duration
}

// NewBudget returns a budget of at most limit per wait (0 or less: never
// poll), yielding to the process's goroutines and checking the clock and the
// caller's state every `every` polls: about a microsecond of polling (64
// reads of a shared counter, 2 or 3 non-blocking system calls). With
// yieldToProcesses they also yield to other processes, for when this host's
// ranks outnumber its CPUs: the peer a poll waits for may need this very CPU.
func NewBudget(limit time.Duration, every int, yieldToProcesses bool) Budget {
	limit = max(limit, 0)
	return Budget{max: limit, limit: limit, every: max(every, 1), yield: yieldToProcesses, pause: yieldPause}
}

// YieldsToProcesses reports whether polls yield to other processes.
func (b *Budget) YieldsToProcesses() bool { return b.yield }

// Limit is the current bound of one wait.
func (b *Budget) Limit() time.Duration { return b.limit }

// Wait is one wait in progress: Begin it, call Again after every poll that
// found nothing, and call End with the outcome.
type Wait struct {
	b      *Budget
	ctx    context.Context // BeginContext's; read at the first yield
	locked int8            // 0 not known yet, 1 OnLockedThread's, -1 not
	polls  int
	until  time.Time
	done   <-chan struct{}
	parked bool
}

// Begin starts a wait that ends early when done (a context's Done channel, may
// be nil) is closed.
func (b *Budget) Begin(done <-chan struct{}) Wait {
	return Wait{b: b, done: done}
}

// Again reports whether the caller should poll once more. Every few polls it
// yields (to this process's goroutines and to other processes) and checks
// stop (the link closed, the peer gone), done and the clock; it returns false
// when any of them says to stop, after which the caller parks or fails.
func (w *Wait) Again(stop func() bool) bool {
	if w.b == nil || w.b.limit <= 0 {
		w.parked = true
		return false
	}
	w.polls++
	if w.polls%w.b.every != 0 {
		return true
	}
	if stop() || closed(w.done) {
		return false
	}
	now := time.Now()
	if w.until.IsZero() {
		w.until = now.Add(w.b.limit)
	} else if now.After(w.until) {
		w.parked = true
		return false
	}
	if w.locked == 0 {
		w.locked = -1
		if w.ctx != nil && w.ctx.Value(lockedKey{}) != nil {
			w.locked = 1
		}
	}
	if w.locked < 0 {
		runtime.Gosched()
	}
	if b := w.b; b.yield && now.After(b.noYieldUntil) {
		t := time.Now()
		yieldCPU()
		if d := time.Since(t); d > slowYield {
			// Recurring (within twice the last pause): pause longer.
			if !b.lastSlow.IsZero() && t.Sub(b.lastSlow) < 2*b.pause {
				b.pause = min(2*b.pause, maxYieldPause)
			} else {
				b.pause = yieldPause
			}
			b.lastSlow = t
			b.noYieldUntil = t.Add(d + b.pause)
		}
	}
	return true
}

// End records how the wait ended: ok when a poll found what the caller waited
// for. A wait that ran out of budget (the caller then parked) halves the
// budget; a successful poll adds a sixteenth of the maximum back: polling
// grows slowly where it pays and shrinks fast where it is wasted (when waits
// are long, as on a loaded machine where the peer is not running).
func (w *Wait) End(ok bool) {
	b := w.b
	if b == nil || b.max <= 0 {
		return
	}
	switch {
	case ok && !w.parked:
		if w.polls > 0 {
			b.limit = min(b.max, b.limit+b.max/minFraction)
		}
	case w.parked:
		b.limit = max(b.max/minFraction, b.limit/2)
	}
}

func closed(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}
