package spin

import (
	"context"
	"runtime"
)

// lockedKey marks a context as that of a call made on a goroutine locked to
// its OS thread (OnLockedThread).
type lockedKey struct{}

// OnLockedThread returns ctx marked for a call made on a goroutine locked to
// its OS thread, such as a cgo callback's (a C thread calling into Go): its
// waits poll without yielding to the process's other goroutines. From a
// locked goroutine runtime.Gosched does not switch goroutines on the thread:
// the scheduler hands the thread's P to another thread, waking it, and puts
// this thread to sleep until a third hand-over gives the P back, two thread
// wake-ups that cost more than the whole wait they interrupt. Yielding to
// other processes (sched_yield) is unaffected.
func OnLockedThread(ctx context.Context) context.Context {
	return context.WithValue(ctx, lockedKey{}, true)
}

// unpolledKey marks a context whose waits park at once (Unpolled).
type unpolledKey struct{}

// Unpolled returns ctx marked for a call whose wait is known to be long:
// its waits do not poll but park at once, and leave the budget's bound as
// it was. A link's re-key waits for the peer to reach the same step
// boundary (milliseconds while the peer finishes its step), and every
// member waits so for each of its links at once: polling there only takes
// the CPU the peers need to get there.
func Unpolled(ctx context.Context) context.Context {
	return context.WithValue(ctx, unpolledKey{}, true)
}

// BeginContext is Begin(ctx.Done()) for a call with ctx: it ends early when
// ctx does, does not yield to other goroutines when ctx is
// OnLockedThread's, and does not poll at all when ctx is Unpolled's.
func (b *Budget) BeginContext(ctx context.Context) Wait {
	if ctx.Value(unpolledKey{}) != nil {
		return Wait{ctx: ctx, done: ctx.Done()} // no budget: Again parks
	}
	w := b.Begin(ctx.Done())
	w.ctx = ctx
	return w
}

// YieldGoroutines lets the process's other goroutines run (runtime.Gosched),
// unless ctx is OnLockedThread's: what a transport does at a frame boundary
// so that at GOMAXPROCS=1 its sending goroutine gets a turn. A call on a
// locked thread runs without one (the binding's small calls on the
// caller's thread), and a yield there would cost two thread wake-ups.
func YieldGoroutines(ctx context.Context) {
	if !onLockedThread(ctx) {
		runtime.Gosched()
	}
}

// onLockedThread reports whether ctx (may be nil) is OnLockedThread's.
func onLockedThread(ctx context.Context) bool {
	return ctx != nil && ctx.Value(lockedKey{}) != nil
}
