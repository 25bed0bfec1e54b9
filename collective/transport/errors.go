package transport

import (
	"errors"
	"fmt"
)

var (
	// ErrPeerClosed: the peer closed the connection or the connection broke.
	ErrPeerClosed = errors.New("peer closed the connection")
	// ErrPeerTimeout: the peer sent or accepted nothing within the I/O timeout.
	ErrPeerTimeout = errors.New("peer did not respond within the I/O timeout")
	// ErrLinkClosed: the link was closed on this side (abort or shutdown).
	ErrLinkClosed = errors.New("link closed locally")
)

// PeerError is a failure of the link to one peer. Err wraps ErrPeerClosed,
// ErrPeerTimeout, ErrLinkClosed, a *FrameError, or the context's error.
type PeerError struct {
	Rank int    // the peer's rank
	Addr string // the peer's address, when known
	Op   string // what was being done: "send", "recv", "connect", ...
	Err  error
}

func (e *PeerError) Error() string {
	if e.Addr != "" {
		return fmt.Sprintf("gorovod: peer rank %d (%s): %s: %v", e.Rank, e.Addr, e.Op, e.Err)
	}
	return fmt.Sprintf("gorovod: peer rank %d: %s: %v", e.Rank, e.Op, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// NamesPeer reports whether err (or an error it wraps) is a PeerError, naming
// the peer it failed on: the member a failed world change can blame.
func NamesPeer(err error) bool {
	var pe *PeerError
	return errors.As(err, &pe)
}

// FrameError is a received frame that is malformed or does not belong here:
// bad magic or version, a job, epoch or sender of another world, a length over
// the limit. Peer is -1 when the sender is not known.
type FrameError struct {
	Peer   int
	Reason string
}

func (e *FrameError) Error() string {
	if e.Peer < 0 {
		return "gorovod: bad frame: " + e.Reason
	}
	return fmt.Sprintf("gorovod: bad frame from rank %d: %s", e.Peer, e.Reason)
}

// HandshakeError is a connection attempt that was refused or failed
// authentication. Rank is the peer's rank, -1 when not known (a stranger).
type HandshakeError struct {
	Rank   int
	Addr   string
	Reason string
	// Fatal is true when retrying cannot help (wrong secret, wrong job, stale epoch).
	Fatal bool
}

func (e *HandshakeError) Error() string {
	who := "unknown peer"
	if e.Rank >= 0 {
		who = fmt.Sprintf("peer rank %d", e.Rank)
	}
	if e.Addr != "" {
		who += " (" + e.Addr + ")"
	}
	return fmt.Sprintf("gorovod: handshake with %s: %s", who, e.Reason)
}
