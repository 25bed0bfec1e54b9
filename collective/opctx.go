package collective

import (
	"context"
	"slices"
	"sync"
	"time"
)

// opContext is the context a collective's sending and receiving halves run
// under: the caller's context, plus a cancellation of its own, so that a half
// that fails wakes the other at once (a send blocked on a peer that stopped
// reading, a receive waiting for a frame that will not come).
//
// A communicator keeps one and binds it to each collective's context instead
// of deriving a context per call: deriving one allocates, and so does every
// transport's registration on its Done channel (transport.Waker), which
// stays put while the channel does. Its Done channel closes when the caller's
// context ends or a half cancels; either fails the collective and so spends
// the communicator, except when the caller's context ends between
// collectives — then the next collective gets a fresh opContext.
type opContext struct {
	done chan struct{}
	// onParentDone is cancelParent as a func value, made once so that
	// registering it with context.AfterFunc allocates only the registration.
	onParentDone func()

	mu     sync.Mutex
	parent context.Context
	closed bool  // done is closed
	cause  error // set by cancel: why a half stopped the other; nil when the parent ended
	// The registration on the parent: the Done channel watched and how to
	// stop watching it.
	watched <-chan struct{}
	stop    func() bool
	// after holds the functions context.AfterFunc registered on x (a
	// transport's waker), run when Done closes; see AfterFunc.
	after   []afterFunc
	afterID uint64
}

type afterFunc struct {
	id uint64
	f  func()
}

func newOpContext() *opContext {
	x := &opContext{done: make(chan struct{}), parent: context.Background()}
	x.onParentDone = x.cancelParent
	return x
}

// bind returns an opContext for a collective running under parent: x itself
// when it can serve (not canceled, and watching parent's Done channel or
// able to switch to it), else a new one. It is called between collectives,
// when no half runs.
func (x *opContext) bind(parent context.Context) *opContext {
	d := parent.Done()
	x.mu.Lock()
	usable := !x.closed
	same := d == x.watched
	if usable && same {
		x.parent = parent
	}
	x.mu.Unlock()
	if usable && same {
		return x
	}
	if usable && (x.stop == nil || x.stop()) {
		// The old registration is gone without having fired.
		x.mu.Lock()
		x.parent, x.watched, x.stop = parent, nil, nil
		x.mu.Unlock()
		x.watch(parent, d)
		return x
	}
	n := newOpContext()
	n.parent = parent
	n.watch(parent, d)
	return n
}

// watch makes the end of parent (whose Done channel is d) close x's.
func (x *opContext) watch(parent context.Context, d <-chan struct{}) {
	if d == nil {
		return // never ends
	}
	stop := context.AfterFunc(parent, x.onParentDone)
	x.mu.Lock()
	x.watched, x.stop = d, stop
	x.mu.Unlock()
}

func (x *opContext) cancelParent() { x.cancel(nil) }

// release stops watching the parent: a spent communicator's opContext must
// not stay registered on its caller's context, which in a trainer lives as
// long as the process while a job under churn spends a communicator per
// world.
func (x *opContext) release() {
	x.mu.Lock()
	stop := x.stop
	x.watched, x.stop = nil, nil
	x.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// cancel closes Done; cause, when not nil, is why one half stopped the other
// (Cause returns it). The first call wins.
func (x *opContext) cancel(cause error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return
	}
	x.closed, x.cause = true, cause
	close(x.done)
	for _, a := range x.after {
		go a.f()
	}
	x.after = nil
}

// AfterFunc is what context.AfterFunc(x, f) uses (it looks for this
// method): f runs on its own goroutine once Done closes, unless stop, called
// first, returns true. Without it, every registration — each transport link
// registers its waker on the context of its calls — would park a goroutine
// that waits for Done.
func (x *opContext) AfterFunc(f func()) (stop func() bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		go f()
		return func() bool { return false }
	}
	x.afterID++
	id := x.afterID
	x.after = append(x.after, afterFunc{id: id, f: f})
	return func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		i := slices.IndexFunc(x.after, func(a afterFunc) bool { return a.id == id })
		if i < 0 {
			return false
		}
		x.after = slices.Delete(x.after, i, i+1)
		return true
	}
}

// Cause is the error a half canceled with or, when the caller's context
// ended, that context's cause.
func (x *opContext) Cause() error {
	x.mu.Lock()
	cause, parent := x.cause, x.parent
	x.mu.Unlock()
	if cause != nil {
		return cause
	}
	return context.Cause(parent)
}

func (x *opContext) Done() <-chan struct{} { return x.done }

func (x *opContext) Err() error {
	x.mu.Lock()
	closed, cause, parent := x.closed, x.cause, x.parent
	x.mu.Unlock()
	switch {
	case !closed:
		return nil
	case cause != nil:
		return context.Canceled
	}
	return parent.Err()
}

func (x *opContext) Deadline() (time.Time, bool) {
	x.mu.Lock()
	parent := x.parent
	x.mu.Unlock()
	return parent.Deadline()
}

func (x *opContext) Value(key any) any {
	x.mu.Lock()
	parent := x.parent
	x.mu.Unlock()
	return parent.Value(key)
}
