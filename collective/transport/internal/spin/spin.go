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
// (0.75–5 ms; with one busy process on the CPU every second or third yield
// is such a slice). The Budget then stops yielding to other processes for
// yieldPause, doubled each time the next slow yield comes within twice the
// last pause, up to maxYieldPause: a few lost slices, where yielding on
// every wait would lose one per wait (measured with one core kept busy: a
// 4 KiB allreduce took 1.7–3.4 ms instead of 3–40 µs; 4 ranks on 2 cores,
// 4 KiB and 256 KiB over shared memory, 1.7 and 4.8 ms with no pause against
// 0.4 and 2.4 ms with one).
const (
	slowYield     = 200 * time.Microsecond
	yieldPause    = 100 * time.Millisecond
	maxYieldPause = 10 * time.Second
)

// A NewYieldingBudget pauses its yields only after two yields of more than
// blipSlowYield within slowWindow, and first for blipPause, doubled each
// time the next two come within a pause's length of the last pause's end.
// On an idle machine, yields among 4 ranks on 2 cores took over 200 µs
// (0.5–4 ms) a few times per 100 ms anyway: the rank sharing the core ran
// that long before it waited, or something else held the CPU for a moment
// (the launcher, a kernel thread, the VM's vCPU descheduled). A pause after
// such a blip costs ranks that poll a shared-memory ring dearly — while
// paused, polls keep the CPU from the very rank they wait for: 4 ranks on 2
// cores, 256 KiB over shared memory, took 480–730 µs an allreduce when a
// slow yield started a 100 ms pause, 120–240 µs without pauses. Pausing
// after two yields over 200 µs, 8 of the 9 runs of 14 that took 136–257 µs
// had a rank that paused and then parked 18–66 times, 1 of the 5 that took
// 91–112 µs; counting only yields over 1 ms, 105–169 µs in 7 runs of 7
// (105–290 with 200 µs). A busy process's turn
// is a whole time slice, ≥ 1 ms (about 4 ms here). TCP's polls keep the
// first rule: with it the same runs were as fast (0.86–1.33x), and with one
// core kept busy the blip rule cost them 0.2–0.96x (it pauses later and
// shorter, so a short job keeps handing slices to the busy process).
const (
	slowWindow    = 10 * time.Millisecond
	blipSlowYield = time.Millisecond
	blipPause     = 10 * time.Millisecond
)

// YieldingFactor is how much longer than its limit a wait of a
// NewYieldingBudget may poll while its polls yield to other processes. Such
// polls cost nothing another process of the host wants: the rank sharing the
// core runs as soon as this one yields. Parking instead costs the wait a
// wake-up through the kernel and then a turn on a CPU another rank holds.
// With ranks two to a core the waits of a pipelined ring are mostly a
// neighbour's turn on the CPU, tens to hundreds of microseconds: measured,
// 4 ranks on 2 cores, 256 KiB allreduce over shared memory, with a 100 µs
// bound 80 % of the waits outlasted the adapted bound and parked (430–570 µs
// an allreduce); with 1 ms 1–3 % did (120–240 µs). The bound still adapts
// (halving while waits outlast it), so an idle job's waits soon poll only a
// sixteenth of it each.
//
// Only for polls that are memory reads (a shared-memory ring's counters). A
// TCP poll is a system call that takes the socket's lock: polling 10x longer
// there tripled the reads of a 4 MiB allreduce, 4 ranks on 2 cores, and cost
// it 5–11 % (the cores are what limits it).
const YieldingFactor = 10

// Budget bounds the polling of one direction of a link and adapts the bound to
// how long that direction's waits last. The zero Budget never polls. It is
// used by one call at a time (under the direction's lock).
type Budget struct {
	max   time.Duration
	limit time.Duration
	every int
	// yield: polls also yield to other processes (sched_yield). Until
	// noYieldUntil they do not: yields found a process that keeps the CPU
	// (the last slow one at lastSlow). The last pause, of length pause,
	// began at pauseStart and ended at pauseEnd. blips: the rules of a
	// NewYieldingBudget (a pause needs two slow yields; the first is short).
	yield        bool
	blips        bool
	noYieldUntil time.Time
	lastSlow     time.Time
	pauseStart   time.Time
	pauseEnd     time.Time
	pause        time.Duration
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
func NewBudget(limit time.Duration, every int, yieldToProcesses bool) Budget {
	limit = max(limit, 0)
	return Budget{max: limit, limit: limit, every: max(every, 1), yield: yieldToProcesses, pause: yieldPause, pausedLimit: limit, sysYield: yieldCPU}
}

// NewYieldingBudget is NewBudget yielding to other processes, for polls that
// are memory reads: its waits poll up to YieldingFactor times limit while the
// yields go on, and no longer than limit while a busy process has paused
// them; a lone slow yield does not pause them (see blipPause).
func NewYieldingBudget(limit time.Duration, every int) Budget {
	b := NewBudget(limit, every, true)
	b.max *= YieldingFactor
	b.limit = b.max
	b.blips = true
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
	if w.locked == 0 { // asked once per wait: a context lookup is not free
		w.locked = -1
		if onLockedThread(w.ctx) {
			w.locked = 1
		}
	}
	if w.locked < 0 {
		runtime.Gosched()
	}
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
	if d <= slowYield || (b.blips && d <= blipSlowYield) {
		return
	}
	prev := b.lastSlow
	b.lastSlow = t
	if !b.blips {
		// Recurring (within twice the last pause): pause longer.
		if !b.pauseStart.IsZero() && t.Sub(b.pauseStart) < 2*b.pause {
			b.pause = min(2*b.pause, maxYieldPause)
		} else {
			b.pause = yieldPause
		}
		b.pauseStart = t
		b.noYieldUntil = t.Add(d + b.pause)
		return
	}
	if prev.IsZero() || t.Sub(prev) > slowWindow {
		return
	}
	b.lastSlow = time.Time{} // the next pause needs two slow yields again
	// Recurring (within a pause's length of the last one's end): pause longer.
	if !b.pauseEnd.IsZero() && t.Sub(b.pauseEnd) < b.pause {
		b.pause = min(2*b.pause, maxYieldPause)
	} else {
		b.pause = blipPause
	}
	b.noYieldUntil = t.Add(d + b.pause)
	b.pauseEnd = b.noYieldUntil
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
