package spin

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func never() bool { return false }

// pollUntilStopped polls a wait that never succeeds and returns how long it
// polled and how many polls it made.
func pollUntilStopped(w *Wait, stop func() bool) (time.Duration, int) {
	t0 := time.Now()
	n := 0
	for w.Again(stop) {
		n++
	}
	return time.Since(t0), n
}

func TestBudgetBoundsAWait(t *testing.T) {
	b := NewBudget(2*time.Millisecond, 4, true)
	w := b.Begin(nil)
	d, n := pollUntilStopped(&w, never)
	if d < 2*time.Millisecond {
		t.Errorf("polled %v, want at least the 2ms budget", d)
	}
	// The bound is checked every 4 polls; each poll yields, so on a busy
	// machine a poll may take long, but not seconds.
	if d > time.Second {
		t.Errorf("polled %v for a 2ms budget", d)
	}
	if n < 4 {
		t.Errorf("%d polls", n)
	}
}

func TestBudgetAdapts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit time.Duration
		yield bool
		max   time.Duration
	}{
		{"own process", 4 * time.Millisecond, false, 4 * time.Millisecond},
		{"yielding to processes", 4 * time.Millisecond, true, 4 * time.Millisecond},
		{"yielding, memory reads", 400 * time.Microsecond, true, 400 * time.Microsecond * YieldingFactor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.limit, 1, tc.yield)
			if tc.max != tc.limit {
				b = NewYieldingBudget(tc.limit, 1)
			}
			testBudgetAdapts(t, b, tc.max)
		})
	}
}

func testBudgetAdapts(t *testing.T, b Budget, max time.Duration) {
	if b.Limit() != max {
		t.Fatalf("a new budget's limit is %v, want %v", b.Limit(), max)
	}
	// Waits that outlast the budget halve it, down to max/16.
	want := max
	for range 6 {
		w := b.Begin(nil)
		pollUntilStopped(&w, never)
		w.End(false)
		want = maxDur(want/2, max/minFraction)
		if b.Limit() != want {
			t.Fatalf("after a wasted spin the limit is %v, want %v", b.Limit(), want)
		}
	}
	// A poll that succeeds adds max/16, up to max.
	for range 20 {
		w := b.Begin(nil)
		w.Again(never)
		w.End(true)
		want = min(want+max/minFraction, max)
		if b.Limit() != want {
			t.Fatalf("after a successful spin the limit is %v, want %v", b.Limit(), want)
		}
	}
	// A wait that succeeded at once (no poll) or was stopped leaves it.
	b.limit = max / 4
	w := b.Begin(nil)
	w.End(true)
	stopped := b.Begin(nil)
	stopped.Again(func() bool { return true })
	stopped.End(false)
	if b.Limit() != max/4 {
		t.Errorf("limit %v after waits that did not spin for nothing, want %v", b.Limit(), max/4)
	}
}

func maxDur(a, b time.Duration) time.Duration { return max(a, b) }

func TestStopAndDoneEndAWait(t *testing.T) {
	b := NewBudget(time.Hour, 8, true)
	stopAfter := 0
	w := b.Begin(nil)
	_, n := pollUntilStopped(&w, func() bool { stopAfter++; return stopAfter == 3 })
	if n > 3*8 {
		t.Errorf("stop was seen after %d polls, want at most %d", n, 3*8)
	}
	done := make(chan struct{})
	close(done)
	w = b.Begin(done)
	if _, n := pollUntilStopped(&w, never); n > 8 {
		t.Errorf("a closed done channel was seen after %d polls", n)
	}
}

func TestZeroBudgetNeverPolls(t *testing.T) {
	for _, b := range []Budget{{}, NewBudget(0, 1, true), NewBudget(-time.Second, 1, true)} {
		w := b.Begin(nil)
		if w.Again(never) {
			t.Errorf("budget %+v polls", b)
		}
		w.End(false)
		if b.Limit() != 0 {
			t.Errorf("budget %+v adapted to %v", b, b.Limit())
		}
	}
}

// An Unpolled context's wait parks at its first poll, whatever the budget,
// and leaves the budget's bound as it was (a long wait there says nothing
// about the direction's usual waits); the same budget's other waits poll.
func TestUnpolledWaitParksAtOnce(t *testing.T) {
	for _, b := range []Budget{NewBudget(time.Hour, 1, false), NewYieldingBudget(time.Hour, 1)} {
		limit := b.Limit()
		w := b.BeginContext(Unpolled(context.Background()))
		if w.Again(never) {
			t.Errorf("budget %+v: an Unpolled wait polls", b)
		}
		w.End(false)
		if b.Limit() != limit {
			t.Errorf("budget %+v: an Unpolled wait adapted the bound %v to %v", b, limit, b.Limit())
		}
		w = b.BeginContext(context.Background())
		if !w.Again(never) {
			t.Errorf("budget %+v: a wait with another context does not poll", b)
		}
		w.End(true)
	}
}

// A wait begun with OnLockedThread's context polls without yielding to the
// process's other goroutines; any other wait lets them run. At GOMAXPROCS=1
// a goroutine started before the wait runs during it only if the wait
// yields (the runtime's own preemption comes after 10 ms, the budget is
// 2 ms).
func TestLockedWaitDoesNotYieldToGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, locked := range []bool{false, true} {
		ctx := context.Background()
		if locked {
			ctx = OnLockedThread(ctx)
		}
		var ran atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() { ran.Store(true) })
		b := NewBudget(2*time.Millisecond, 4, false)
		w := b.BeginContext(ctx)
		for !ran.Load() && w.Again(never) {
		}
		if got := ran.Load(); got == locked {
			t.Errorf("locked %v: the other goroutine ran during the wait: %v", locked, got)
		}
		wg.Wait()
	}
}

// TestPauseNeedsTwoSlowYields: a slow yield now and then (something held the
// CPU for a moment) does not pause the yields; two within slowWindow do, for
// blipPause, doubling while it recurs; and the waits of a paused budget poll
// no longer than a non-yielding budget's limit.
func TestPauseNeedsTwoSlowYields(t *testing.T) {
	const limit = time.Millisecond
	b := NewYieldingBudget(limit, 1)
	slow := false
	// A slow yield is one that returns after blipSlowYield; this one does.
	// One that returns after slowYield does not count for this budget.
	medium := false
	b.sysYield = func() {
		switch {
		case slow:
			time.Sleep(blipSlowYield + 50*time.Microsecond)
		case medium: // a sleep this short may oversleep past blipSlowYield
			for t0 := time.Now(); time.Since(t0) < slowYield+50*time.Microsecond; {
			}
		}
	}
	yieldOnce := func() { // a wait's first poll yields
		w := b.Begin(nil)
		w.Again(never)
	}
	for range 5 {
		slow = true
		yieldOnce()
		slow = false
		yieldOnce()
		if !b.noYieldUntil.IsZero() {
			t.Fatal("lone slow yields paused the yields")
		}
		// The next slow yield comes long after this one.
		b.lastSlow = b.lastSlow.Add(-2 * slowWindow)
	}
	medium = true
	for range 3 {
		yieldOnce()
	}
	if !b.noYieldUntil.IsZero() {
		t.Fatalf("yields of %v paused the yields", slowYield+50*time.Microsecond)
	}
	medium, slow = false, true
	yieldOnce()
	yieldOnce()
	if pause := time.Until(b.noYieldUntil); pause < blipPause/2 || pause > blipPause+time.Second {
		t.Fatalf("two slow yields in a row paused the yields for %v, want about %v", pause, blipPause)
	}
	if b.Limit() != limit*YieldingFactor {
		t.Fatalf("limit %v, want %v", b.Limit(), limit*YieldingFactor)
	}
	// Paused: a wait's bound is the non-yielding limit, not the yielding one
	// (the bound starts at the wait's first clock check, before now).
	w := b.Begin(nil)
	w.Again(never)
	if bound := time.Until(w.until); bound > limit {
		t.Errorf("a wait of a paused budget may poll %v, want at most %v", bound, limit)
	}
	// Slow yields again right after the pause: twice as long.
	b.noYieldUntil = time.Time{}
	yieldOnce()
	yieldOnce()
	if pause := time.Until(b.noYieldUntil); pause < blipPause*3/2 {
		t.Fatalf("a recurring pause lasts %v, want about %v", pause, 2*blipPause)
	}
	// Not paused: the yielding limit.
	b.noYieldUntil = time.Time{}
	slow = false
	before := time.Now()
	w = b.Begin(nil)
	w.Again(never)
	if bound := w.until.Sub(before); bound < limit*YieldingFactor {
		t.Errorf("a wait of a yielding budget may poll %v, want %v", bound, limit*YieldingFactor)
	}
}
