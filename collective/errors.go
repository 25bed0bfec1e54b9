package collective

import (
	"errors"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
)

// The typed errors of the transport layer, which name the peer behind a failure.
type (
	// PeerError is a failure of the link to one peer: it closed, died, stayed
	// silent past the I/O timeout, or the context ended while waiting on it.
	PeerError = transport.PeerError
	// HandshakeError is a peer that could not be connected or authenticated.
	HandshakeError = transport.HandshakeError
	// FrameError is a malformed frame or one from another job or epoch.
	FrameError = transport.FrameError
)

var (
	// ErrClosed is returned by every collective of a communicator that was closed.
	ErrClosed = errors.New("collective: communicator closed")
	// ErrAborted is returned by the collectives of a communicator that Abort stopped.
	ErrAborted = errors.New("collective: communicator aborted")
	// ErrPeerClosed, ErrPeerTimeout: see PeerError.
	ErrPeerClosed  = transport.ErrPeerClosed
	ErrPeerTimeout = transport.ErrPeerTimeout
)

// opDesc describes one collective call as every rank must make it.
type opDesc struct {
	seq   uint64
	coll  collKind
	dtype DType
	op    ReduceOp
	count uint64
	aux   uint32
	// bytes is the buffer size for a tracer when it is not count × dtype
	// size (alltoall); it never travels in frames.
	bytes int64
}

func (d opDesc) String() string {
	s := fmt.Sprintf("%v #%d (%d × %v", d.coll, d.seq, d.count, d.dtype)
	if d.coll.reduces() {
		s += ", " + d.op.String()
	}
	if d.coll.rooted() {
		s += fmt.Sprintf(", root %d", d.aux)
	}
	return s + ")"
}

// MismatchError is returned when ranks call different collectives at the same
// point of their sequence: another kind, dtype, op, element count, root or
// algorithm. Both descriptions are included.
type MismatchError struct {
	Peer   int    // the rank whose frame disagreed
	Field  string // what differs
	Local  string // what this rank called
	Remote string // what the peer called
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("collective: mismatched collectives: this rank called %s, rank %d called %s (%s differs)", e.Local, e.Peer, e.Remote, e.Field)
}

// RemoteAbortError is returned when a peer gave up on the communicator and said
// why: every rank learns of a failure that only one of them saw.
type RemoteAbortError struct {
	Rank   int
	Reason string
}

func (e *RemoteAbortError) Error() string {
	return fmt.Sprintf("collective: rank %d aborted the communicator: %s", e.Rank, e.Reason)
}
