package linkutil

import (
	"context"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Deadline is when a blocking wait starting now gives up: the earlier of
// IOTimeout of silence and ctx's deadline, and whether it is ctx's (then an
// expired wait is the context's DeadlineExceeded, not the peer's timeout).
func (b *Base) Deadline(ctx context.Context) (time.Time, bool) {
	dl := time.Now().Add(b.IOTimeout)
	if cd, ok := ctx.Deadline(); ok && !cd.After(dl) {
		return cd, true
	}
	return dl, false
}

// Interrupted is the check a wait makes just after setting its deadline and
// before it sleeps: the context may have ended just before the new deadline
// replaced the past one its watch (transport.Waker) set, and Close may have
// come meanwhile. It returns ctx's error, ErrLinkClosed, or nil to sleep.
func (b *Base) Interrupted(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.Closed.Load() {
		return transport.ErrLinkClosed
	}
	return nil
}

// Expired is what a wait whose deadline passed reports: the context's error
// when it has ended (a cancellation wakes a wait through a past deadline
// too), DeadlineExceeded when the deadline was ctx's, else ErrPeerTimeout.
func Expired(ctx context.Context, ctxBound bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctxBound {
		return context.DeadlineExceeded
	}
	return transport.ErrPeerTimeout
}

// IsWait reports whether err ended a wait without touching the stream: the
// I/O timeout or the context. Such a call may be retried.
func IsWait(err error) bool {
	return err == transport.ErrPeerTimeout || err == context.Canceled || err == context.DeadlineExceeded
}

// Failure classifies a failure of the link's connection once the transport's
// own expected cases are ruled out: ErrLinkClosed after Close (the failure
// is Close's doing), ErrPeerClosed when the transport recognized the peer's
// close (peerClosed), else a *BrokenError naming what broke.
func (b *Base) Failure(err error, peerClosed bool, what string) error {
	if b.Closed.Load() {
		return transport.ErrLinkClosed
	}
	if peerClosed {
		return transport.ErrPeerClosed
	}
	return &BrokenError{What: what, Err: err}
}

// BrokenError is a link failure other than the expected ones (a host
// unreachable, a keepalive timeout, a pipe error): it is ErrPeerClosed for
// callers that only ask whether the peer is gone, and keeps the system error
// for the message.
type BrokenError struct {
	What string // what broke, as the transport calls it: "connection", "association"
	Err  error
}

func (e *BrokenError) Error() string   { return e.What + " broke: " + e.Err.Error() }
func (e *BrokenError) Unwrap() []error { return []error{transport.ErrPeerClosed, e.Err} }
