package transport

import (
	"context"
	"time"
)

// Waker turns a context's end into an I/O deadline in the past, which is the
// only way to interrupt a blocked read or write on a connection or a pipe.
// Links keep one per direction. Its context.AfterFunc registration is kept
// from call to call while the calls' contexts share a Done channel (the usual
// case: one context per collective or per step), so the steady state
// registers nothing and allocates nothing; Release drops it when the context
// changes and when the link closes.
type Waker struct {
	setDeadline func(time.Time)
	fired       chan struct{}
	fn          func()
	// The registration: the Done channel watched and how to stop watching.
	done <-chan struct{}
	stop func() bool
}

// Init prepares the waker; setDeadline sets the watched direction's deadline.
func (w *Waker) Init(setDeadline func(time.Time)) {
	w.setDeadline = setDeadline
	w.fired = make(chan struct{}, 1)
	w.fn = w.fire
}

func (w *Waker) fire() {
	// A deadline in the past wakes any blocked I/O at once.
	w.setDeadline(time.Unix(1, 0))
	w.fired <- struct{}{}
}

// SetDeadline sets the watched direction's deadline.
func (w *Waker) SetDeadline(t time.Time) { w.setDeadline(t) }

// Watch makes sure the end of ctx wakes this direction's I/O.
func (w *Waker) Watch(ctx context.Context) {
	d := ctx.Done()
	if d == w.done {
		return
	}
	w.Release()
	if d != nil {
		w.done, w.stop = d, context.AfterFunc(ctx, w.fn)
	}
}

// Release drops the registration. If it already fired, it waits for the
// callback, so the past deadline it sets cannot land on a later call.
func (w *Waker) Release() {
	if w.stop != nil && !w.stop() {
		<-w.fired
	}
	w.done, w.stop = nil, nil
}
