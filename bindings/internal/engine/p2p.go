package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// Point-to-point messages (Send, Recv) between two ranks of the world.
//
// They stand outside the submission order: a rank sends when it likes and
// its peer receives when it posts the receive, while the other calls run
// in their order. So they do not go through the executor: each runs on a
// goroutine of its own at once (a receive is posted before the call
// returns, so receives match messages in the order they were made), on the world's communicator
// (collective.Communicator.Send and Recv, which share its links with the
// collectives), and its handle is collected as any other. Messages from one
// rank to another with one tag arrive in the order sent; a receive takes
// the next one with its tag whatever came with other tags before it.
//
// A message whose length differs from the receive buffer's fails that
// receive (a *collective.SizeMismatchError), and its send too when it went
// by rendezvous (over 16 KiB: see collective/p2p.go), and the world goes
// on. A send over 16 KiB completes once the peer has posted its receive. Any
// other failure — the peer died or stayed silent past the I/O timeout, the
// world broke under the message — breaks the world as a failed collective
// does: the engine has the session rebuild it (a call of its own, queued)
// and the message's handle fails with sync.ErrWorldChanged, as a
// collective's would. Messages are not carried from one world to the next:
// one submitted before a world change the trainer has not acknowledged
// (Reset) is refused.
//
// A receive from any rank takes the next message with its tag from any
// other rank of the world (RecvAny), or of a process set this process is a
// member of (RecvAnyOn: the messages of the ranks outside the set stay for
// other receives); either names the sender by world rank.

// Send sends buf to world rank peer as one message with tag. The send is
// posted before Send returns, so messages with one tag are numbered, and
// received, in the order the sends were made.
func (e *Engine) Send(peer int, tag uint64, buf collective.Buffer) (Handle, error) {
	return e.p2p("send", peer, 0, tag, buf, func(c *collective.Communicator) (func(ctx context.Context) error, error) {
		return c.PostSend(peer, tag, buf.Host).Wait, nil // numbered in the order the sends were made
	})
}

// Recv receives into buf the next message from world rank peer with tag.
// The receive is posted before Recv returns, so receives match messages in
// the order they were made.
func (e *Engine) Recv(peer int, tag uint64, buf collective.Buffer) (Handle, error) {
	return e.p2p("recv", peer, 0, tag, buf, func(c *collective.Communicator) (func(ctx context.Context) error, error) {
		posted := c.PostRecv(peer, tag, buf.Host)
		return func(ctx context.Context) error {
			_, err := posted.Wait(ctx)
			return err
		}, nil
	})
}

// RecvAny receives into buf the next message with tag from any rank of the
// world (collective.Communicator.RecvAny: it takes its place among the
// receives posted for each peer, in posting order, posted before RecvAny
// returns) and writes the sender's
// world rank to *source before the handle completes, a size mismatch
// included. source is the caller's until then. A world of one rank has no
// one to receive from: ErrInvalid.
func (e *Engine) RecvAny(tag uint64, buf collective.Buffer, source *int32) (Handle, error) {
	return e.RecvAnyOn(0, tag, buf, source)
}

// RecvAnyOn is RecvAny from any other member of process set set (0: the
// world): the messages of ranks outside it are left for other receives
// (collective.Communicator.PostRecvAnyOf). *source is the sender's world
// rank. A set this process is not a member of is refused (ErrNotMember), as
// is one of this process alone (ErrInvalid) and an unknown one
// (ErrUnknownSet).
func (e *Engine) RecvAnyOn(set int32, tag uint64, buf collective.Buffer, source *int32) (Handle, error) {
	if source == nil {
		return 0, fmt.Errorf("%w: recv from any rank needs somewhere to write the sender's rank", ErrInvalid)
	}
	return e.p2p("recv", anyRank, set, tag, buf, func(c *collective.Communicator) (func(ctx context.Context) error, error) {
		var posted *collective.PostedRecv
		if set == 0 {
			posted = c.PostRecvAny(tag, buf.Host)
		} else {
			// Under e.mu: the set's ranks are the world c is the
			// communicator of.
			info, err := e.processSet(set)
			if err != nil {
				return nil, fmt.Errorf("recv from any rank: %w", err)
			}
			if info.Rank < 0 {
				return nil, fmt.Errorf("recv from any rank: rank %d: %w %d (ranks %v)", e.topo.Rank, ErrNotMember, set, info.Ranks)
			}
			others := slices.DeleteFunc(info.Ranks, func(r int) bool { return r == e.topo.Rank })
			if len(others) == 0 {
				return nil, fmt.Errorf("%w: recv from any rank of process set %d: this process is its only rank", ErrInvalid, set)
			}
			posted = c.PostRecvAnyOf(others, tag, buf.Host)
		}
		return func(ctx context.Context) error {
			from, err := posted.Wait(ctx)
			if from >= 0 {
				*source = int32(from)
			}
			return err
		}, nil
	})
}

// anyRank is p2p's peer for a receive from any rank.
const anyRank = -1

// p2p starts a point-to-point call: start runs on the caller's goroutine
// under e.mu (a receive is posted there, so that one caller's receives are
// posted in the order they were made), refuses the call or returns what
// runs on a goroutine of its own until the call is done; peer is a world
// rank, or anyRank (from any member of process set set).
func (e *Engine) p2p(what string, peer int, set int32, tag uint64, buf collective.Buffer, start func(c *collective.Communicator) (func(ctx context.Context) error, error)) (Handle, error) {
	if err := checkBuffers(what, buf); err != nil {
		return 0, err
	}
	if buf.Device != nil {
		return 0, fmt.Errorf("%w: %s: point-to-point messages take host memory", ErrInvalid, what)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.refused(); err != nil {
		return 0, err
	}
	from := fmt.Sprintf("rank %d", peer)
	switch {
	case peer == anyRank && set != 0:
		from = fmt.Sprintf("any rank of process set %d", set)
	case peer == anyRank:
		from = "any rank"
		if e.topo.Size < 2 {
			return 0, fmt.Errorf("%w: %s from any rank: this process is the world's only rank", ErrInvalid, what)
		}
	case peer < 0 || peer >= e.topo.Size:
		return 0, fmt.Errorf("%w: %s: rank %d outside the world of %d", ErrInvalid, what, peer, e.topo.Size)
	case peer == e.topo.Rank:
		return 0, fmt.Errorf("%w: %s: rank %d is this process", ErrInvalid, what, peer)
	}
	comm := e.comm
	run, err := start(comm) // under e.mu: two callers' calls are posted in the order they were made
	if err != nil {
		return 0, err
	}
	c := &call{what: fmt.Sprintf("%s with tag %d (%s)", what, tag, from), gen: e.gen, done: make(chan struct{})}
	e.next++
	h := e.next
	e.handles[h] = c
	e.p2pRunning.Add(1)
	go func() {
		defer e.p2pRunning.Done()
		err := run(e.ctx)
		var size *collective.SizeMismatchError
		switch {
		case err == nil, errors.As(err, &size):
		case e.ctx.Err() != nil:
			err = ErrClosed
		default:
			err = e.p2pFailed(c.what, comm, err)
		}
		c.finish(err)
	}()
	return h, nil
}

// p2pFailed turns the failure of a point-to-point call on comm into the
// error its handle gives. The communicator failed (Send and Recv fail it),
// so the world must be rebuilt: a call queued for the executor has the
// session do it, as for a failed collective (sync.Session.Collective), and
// the engine take note of the new world.
func (e *Engine) p2pFailed(what string, comm *collective.Communicator, err error) error {
	changed := fmt.Errorf("%w: %s failed: %v", gsync.ErrWorldChanged, what, err)
	rebuild := &call{what: "rebuild after a failed " + what, run: func(ctx context.Context, s *gsync.Session) error {
		return s.Collective(ctx, func(ctx context.Context, cur *collective.Communicator) error {
			if cur != comm {
				return nil // rebuilt already
			}
			return err
		})
	}}
	e.mu.Lock()
	if e.refused() != nil {
		// Closing, or the world changed already.
		e.mu.Unlock()
		return changed
	}
	rebuild.gen, rebuild.done = e.gen, make(chan struct{})
	e.queue = append(e.queue, rebuild)
	e.wakeExecutor()
	e.mu.Unlock()
	<-rebuild.done
	if rebuild.err != nil && errors.Is(rebuild.err, gsync.ErrWorldChanged) {
		return fmt.Errorf("%w (%s failed: %v)", rebuild.err, what, err)
	}
	return changed
}
