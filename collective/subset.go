package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gorovod/gorovod/collective/transport"
)

// MaxSubsetID bounds the id of a subset communicator (Subset): the id is
// the top 16 bits of its frames' sequence numbers.
const MaxSubsetID = 1<<16 - 1

// Subset returns a communicator over some of c's ranks — members, c's ranks
// in increasing order, this rank among them — that runs on c's links: no
// connection is made, so every member can build it at once, with no message
// exchanged, and the ranks outside it need not know it exists. Its rank r is
// c's rank members[r].
//
// id (1 to MaxSubsetID, the same on every member) tells its frames from
// c's and from other subsets' on a shared link: each subset numbers its
// collectives on its own, and a rank that runs another subset's collective
// than its peer gets a *MismatchError instead of misreading its data.
//
// The subset and c share their links, so they run one collective at a time
// between them (a collective on one waits for the other's to finish), and
// on each pair of ranks they must run their collectives in the same order.
// Ranks outside the subset may meanwhile run collectives of their own on c
// or on other subsets: frames on a link between two ranks wait until the
// receiver runs the collective they belong to.
//
// A failure of either breaks both: a failed collective on the subset leaves
// the shared links' streams out of step, so it aborts c (and with it every
// other subset of c), and a subset stops with c. Errors of the subset name
// c's ranks (MismatchError.Peer, RemoteAbortError.Rank, PeerError.Rank).
// Closing the subset leaves c as it is.
func (c *Communicator) Subset(id int, members []int) (*Communicator, error) {
	if id < 1 || id > MaxSubsetID {
		return nil, fmt.Errorf("collective: subset id %d outside 1 to %d", id, MaxSubsetID)
	}
	if len(members) == 0 {
		return nil, fmt.Errorf("collective: a subset of no ranks")
	}
	me := -1
	for i, r := range members {
		switch {
		case r < 0 || r >= c.Size():
			return nil, fmt.Errorf("collective: subset member %d outside the world of %d", r, c.Size())
		case i > 0 && r <= members[i-1]:
			return nil, fmt.Errorf("collective: subset members %v are not in increasing order without repeats", members)
		case r == c.Rank():
			me = i
		}
	}
	if me < 0 {
		return nil, fmt.Errorf("collective: rank %d is not among the subset's members %v", c.Rank(), members)
	}
	w := transport.World{JobID: c.world.JobID, Epoch: c.world.Epoch, Rank: me, Addrs: make([]string, len(members))}
	if len(c.world.Hosts) > 0 {
		w.Hosts = make([]string, len(members))
	}
	links := make([]transport.Link, len(members))
	for i, r := range members {
		w.Addrs[i] = c.world.Addrs[r]
		if w.Hosts != nil {
			w.Hosts[i] = c.world.Hosts[r]
		}
		if r != c.Rank() {
			links[i] = subsetLinkOf(c.links[r], i)
		}
	}
	s, err := NewFromLinks(w, links, c.cfg)
	if err != nil {
		return nil, err
	}
	s.parent, s.members, s.linkMu = c, slices.Clone(members), c.linkMu
	s.seqBase = uint64(id) << 48
	s.log = s.log.With("subset", id)
	return s, nil
}

// Members returns, for a subset communicator, its parent's rank of each of
// its ranks; nil for a communicator that owns its links.
func (c *Communicator) Members() []int { return slices.Clone(c.members) }

// inParentRanks rewrites the ranks a subset's error names (its own) into
// its parent's; the error was made by this communicator's failed
// collective and is not shared yet. PeerErrors come from the links, which
// name the parent's ranks already.
func (c *Communicator) inParentRanks(err error) error {
	if c.members == nil {
		return err
	}
	parent := func(r int) int {
		if r >= 0 && r < len(c.members) {
			return c.members[r]
		}
		return r
	}
	var m *MismatchError
	if errors.As(err, &m) {
		m.Peer = parent(m.Peer)
	}
	var a *RemoteAbortError
	if errors.As(err, &a) {
		a.Rank = parent(a.Rank)
	}
	return err
}

// subsetLink is one of a parent's links as a subset communicator sees it:
// the peer has its rank in the subset, and closing it is left to the
// parent, which owns it.
type subsetLink struct {
	transport.Link
	peer int
}

func (l *subsetLink) Peer() int    { return l.peer }
func (l *subsetLink) Close() error { return nil }

// subsetInPlaceLink is a subsetLink over a link that hands payloads over in
// place, keeping that ability.
type subsetInPlaceLink struct {
	subsetLink
	in transport.InPlaceLink
}

func (l *subsetInPlaceLink) SendInPlace(ctx context.Context, h *transport.Header, payload []byte) error {
	return l.in.SendInPlace(ctx, h, payload)
}

func (l *subsetInPlaceLink) RecvPayloadInPlace(ctx context.Context, scratch []byte, fn func(off int, piece []byte) error) error {
	return l.in.RecvPayloadInPlace(ctx, scratch, fn)
}

func subsetLinkOf(l transport.Link, peer int) transport.Link {
	if in, ok := l.(transport.InPlaceLink); ok {
		return &subsetInPlaceLink{subsetLink{l, peer}, in}
	}
	return &subsetLink{l, peer}
}
