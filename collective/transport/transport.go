package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorovod/gorovod/collective/transport/internal/spin"
)

// OnLockedThread returns ctx for a collective run on a goroutine locked to
// its OS thread, such as a cgo callback's (a C thread calling into Go, as a
// language binding's does): the transports' waits then poll without
// yielding to the process's other goroutines, which from a locked goroutine
// costs two thread wake-ups per yield (see the spin package).
func OnLockedThread(ctx context.Context) context.Context { return spin.OnLockedThread(ctx) }

// World names one ordered group of workers at one membership epoch: the unit a
// Transport connects. Every rank of a world must be given the same JobID, Epoch and
// Addrs; Rank differs.
type World struct {
	JobID string   // the training job; frames of other jobs are rejected
	Epoch uint64   // the membership epoch; frames of other epochs are rejected
	Rank  int      // this worker's position in Addrs
	Addrs []string // the transport address of every rank, indexed by rank
	// Hosts optionally names the host of every rank, indexed by rank: ranks
	// with the same name share a host. Empty: the host of a rank is the host
	// part of its address (so ranks on one machine that advertise different
	// addresses count as different hosts). The collectives order their rings
	// and choose hierarchical algorithms by it (collective.Topology); it
	// does not decide which pairs use shared memory (the transports compare
	// host identities for that).
	Hosts []string
}

// Size is the number of ranks in the world.
func (w World) Size() int { return len(w.Addrs) }

// Validate reports whether the world is well formed.
func (w World) Validate() error {
	if w.JobID == "" {
		return fmt.Errorf("transport: world has an empty job id")
	}
	if len(w.Addrs) == 0 {
		return fmt.Errorf("transport: world has no ranks")
	}
	if w.Rank < 0 || w.Rank >= len(w.Addrs) {
		return fmt.Errorf("transport: rank %d outside world of size %d", w.Rank, len(w.Addrs))
	}
	if len(w.Hosts) != 0 && len(w.Hosts) != len(w.Addrs) {
		return fmt.Errorf("transport: world names the hosts of %d ranks but has %d", len(w.Hosts), len(w.Addrs))
	}
	return nil
}

// MaxWorldSize bounds the world size a Hello may name.
const MaxWorldSize = 1 << 20

// Transport connects the ranks of a world to each other.
//
// One Transport usually lives as long as the worker process and connects one world
// after another (one per membership epoch); connections of different worlds never mix.
type Transport interface {
	// Addr is the address other ranks use to reach this endpoint (what goes into
	// World.Addrs at this worker's rank).
	Addr() string
	// Connect returns one authenticated Link per other rank of w, indexed by rank
	// (links[w.Rank] is nil), once every pair is connected. It fails with a
	// *PeerError or *HandshakeError naming a rank that could not be reached or
	// authenticated, or with the context's error.
	Connect(ctx context.Context, w World) ([]Link, error)
	// Close stops accepting connections. Links already returned stay usable until
	// they are closed themselves.
	Close() error
}

// InlinePayload is the payload size up to which a Send must complete without the
// peer receiving, as long as at most a few such frames are outstanding on the
// link: every transport buffers at least that much. The collectives rely on it to
// send small frames from the calling goroutine before receiving, which saves a
// goroutine hand-off on the latency-critical path.
const InlinePayload = 16 << 10

// Link is an authenticated, ordered, reliable frame stream to one peer.
//
// One goroutine may send while another receives; concurrent Send calls are
// serialized, so a frame is never interleaved with another. Receiving is for one
// goroutine at a time. Every blocking method returns a *PeerError naming the peer
// when the peer closes, dies or stays silent past the I/O timeout, and the
// context's error (wrapped in a *PeerError) when ctx ends first.
type Link interface {
	// Peer is the rank at the other end.
	Peer() int
	// RemoteAddr is the peer's address, for error messages.
	RemoteAddr() string
	// Send writes one frame: h (whose Length must equal len(payload)) then payload.
	// The transport fills in Magic, Version, JobID, Epoch and Sender.
	Send(ctx context.Context, h *Header, payload []byte) error
	// RecvHeader reads the next frame's header. It checks what the transport owns
	// (magic, version, job, epoch, sender) and fails with a *FrameError otherwise;
	// the rest is the caller's to check.
	RecvHeader(ctx context.Context, h *Header) error
	// RecvPayload reads the payload of the frame whose header was just received,
	// straight into p; len(p) must equal that header's Length.
	RecvPayload(ctx context.Context, p []byte) error
	// Close tears the link down at once; blocked calls return promptly with an
	// error wrapping ErrLinkClosed.
	Close() error
}

// The defaults every transport's Config shares.
const (
	// DefaultIOTimeout is how long a peer may stay silent on a blocked Send
	// or Recv before the call fails with ErrPeerTimeout.
	DefaultIOTimeout = 30 * time.Second
	// DefaultHandshakeTimeout bounds each exchange of the connection
	// handshake.
	DefaultHandshakeTimeout = 5 * time.Second
)

// ErrInvalidConfig is wrapped (through each transport's own ErrInvalidConfig)
// by every error about a transport configuration that cannot work.
var ErrInvalidConfig = errors.New("invalid transport configuration")

// ChunkHinter is an optional Link extension through which a transport
// suggests the pipelining chunk of the collectives over its links (the
// frame size of a ring step; collective.Config.ChunkBytes left at 0) for a
// world whose ranks on this host outnumber its CPUs (HostCPUs). It is a
// property of the transport, not of one link's history: links carried from
// one world into the next suggest the same as fresh ones. 0: no suggestion.
type ChunkHinter interface {
	Link
	OversubscribedChunkBytes() int
}

// HostCPUs is how many CPUs the ranks of this host share: the CPUs online,
// not this process's (a launcher may have pinned it to its share of them).
// The transports count a world as oversubscribed when its ranks on this
// host outnumber these.
func HostCPUs() int { return spin.HostCPUs() }

// InPlaceLink is an optional Link extension for frames whose receiver
// consumes the payload where it lands — reduces it into its result — instead
// of keeping a copy: a shared-memory transport then lets the receiver read the
// payload straight out of its ring, saving the copy into a staging buffer and
// the second pass over it. The two halves interoperate with the plain ones:
// a frame sent with Send may be taken with RecvPayloadInPlace and one sent
// with SendInPlace with RecvPayload; only the cost differs.
type InPlaceLink interface {
	Link
	// SendInPlace is Send for a frame the receiver is expected to take with
	// RecvPayloadInPlace: the payload goes where the receiver can read it in
	// place, and, as for frames up to InlinePayload, the call does not wait
	// for the receiver to have read it when the transport has room for it.
	SendInPlace(ctx context.Context, h *Header, payload []byte) error
	// RecvPayloadInPlace consumes the payload of the frame whose header was
	// just received by calling fn on consecutive pieces of it, in order; off is
	// a piece's offset in the payload. A piece is valid only until fn returns
	// and must not be written. Every piece but the last is a multiple of 64
	// bytes long. scratch, as long as the payload, is where the transport may
	// put the bytes on their way; its contents are undefined afterwards. An
	// error from fn ends the call with that error and leaves the link broken
	// (the rest of the payload is unread).
	RecvPayloadInPlace(ctx context.Context, scratch []byte, fn func(off int, piece []byte) error) error
}
