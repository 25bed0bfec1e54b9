package spin

import (
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
// (0.75–3 ms). Once slowStreak yields in a row have been slow, the Budget
// stops yielding to other processes for yieldPause, doubled each time the
// next streak comes within twice the last pause, up to maxYieldPause: a few
// lost slices, where yielding on every wait would lose one per wait
// (measured with one core kept busy: a 4 KiB allreduce took 1.7–3.4 ms
// instead of 3–40 µs; 4 ranks on 2 cores, 4 KiB and 256 KiB over shared
// memory, 1.7 and 4.8 ms with no pause against 0.4 and 2.4 ms with it).
//
// One or two slow yields are not a busy process: with nothing else running,
// yields among 4 ranks on 2 cores took over 200 µs (0.5–4 ms) a few times
// per 100 ms anyway — a rank of the job running that long before it waits,
// the VM's vCPU descheduled — and a pause that such a yield starts costs
// dearly: while paused, polls keep the CPU from the very rank they wait for
// (4 ranks on 2 cores, 256 KiB over shared memory: 480–730 µs an allreduce
// when a pause began at the first slow yield, 120–200 µs with a streak of 3).
const (
	slowYield     = 200 * time.Microsecond
	slowStreak    = 3
	yieldPause    = 100 * time.Millisecond
	maxYieldPause = 10 * time.Second
)

// YieldingFactor is how much longer than its limit a wait may poll when its
// polls yield to other processes (NewBudget with yieldToProcesses). Such
// polls cost nothing another process of the host wants: the rank sharing
// the core runs as soon as this one yields. Parking instead costs the wait a
// wake-up through the kernel and then a turn on a CPU another rank holds.
// With ranks two to a core the waits of a pipelined ring are mostly a
// neighbour's turn on the CPU, tens to hundreds of microseconds: measured,
// 4 ranks on 2 cores, 256 KiB allreduce over shared memory, with a 100 µs
// bound 80 % of the waits outlasted the adapted bound and parked (430–570 µs
// an allreduce); with 1 ms 1–3 % did (120–240 µs). The bound still adapts
// (halving while waits outlast it), so an idle job's waits soon poll only
// a sixteenth of it each.
const YieldingFactor = 10

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
	slowInARow   int
	// pausedLimit bounds a wait while its yields are paused: then its polls
	// keep the CPU from whatever else wants it, so it polls no longer than
	// a budget that never yields.
	pausedLimit time.Duration
	// sysYield is sched_yield (tests replace it).
	sysYield func()
}

// NewBudget returns a budget of at most limit per wait (0 or less: never
// poll), yielding to the process's goroutines and checking the clock and the
// caller's state every `every` polls: about a microsecond of polling (64
// reads of a shared counter, 2 or 3 non-blocking system calls). With
// yieldToProcesses they also yield to other processes, for when this host's
// ranks outnumber its CPUs: the peer a poll waits for may need this very CPU.
// Such a budget polls up to YieldingFactor times limit per wait (limit while
// a busy process has paused its yields).
func NewBudget(limit time.Duration, every int, yieldToProcesses bool) Budget {
	limit = max(limit, 0)
	b := Budget{max: limit, limit: limit, every: max(every, 1), yield: yieldToProcesses, pause: yieldPause, pausedLimit: limit, sysYield: yieldCPU}
	if yieldToProcesses {
		b.max *= YieldingFactor
		b.limit = b.max
	}
	return b
}

// YieldsToProcesses reports whether polls yield to other processes.
func (b *Budget) YieldsToProcesses() bool { return b.yield }

// Limit is the current bound of one wait.
func (b *Budget) Limit() time.Duration { return b.limit }

// Wait is one wait in progress: Begin it, call Again after every poll that
// found nothing, and call End with the outcome.
type Wait struct {
	b      *Budget
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
	b := w.b
	now := time.Now()
	yieldNow := b.yield && now.After(b.noYieldUntil)
	if w.until.IsZero() {
		limit := b.limit
		if b.yield && !yieldNow {
			limit = min(limit, b.pausedLimit)
		}
		w.until = now.Add(limit)
	} else if now.After(w.until) {
		w.parked = true
		return false
	}
	runtime.Gosched()
	if yieldNow {
		b.yieldToProcesses()
	}
	return true
}

// yieldToProcesses lets other processes have the CPU and pauses these yields
// when they keep handing it to a process that holds it for a time slice.
func (b *Budget) yieldToProcesses() {
	t := time.Now()
	b.sysYield()
	d := time.Since(t)
	if d <= slowYield {
		b.slowInARow = 0
		return
	}
	if b.slowInARow++; b.slowInARow < slowStreak {
		return
	}
	b.slowInARow = 0
	// Recurring (within twice the last pause): pause longer.
	if !b.lastSlow.IsZero() && t.Sub(b.lastSlow) < 2*b.pause {
		b.pause = min(2*b.pause, maxYieldPause)
	} else {
		b.pause = yieldPause
	}
	b.lastSlow = t
	b.noYieldUntil = t.Add(d + b.pause)
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
