package tcp

import (
	"context"
	"crypto/hmac"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
)

// Moving a link into the next world (transport.RekeyableLink): each lane
// sends a rekey frame under its current keys, carrying the new world, both
// ends' new ranks, a fresh nonce and a MAC under the lane's chaining
// secret; then reads the peer's, checks it and derives the lane's new keys
// from the chaining secret and both nonces (framesec.Rekey). The counters
// of the new keys start at zero, and every frame after the rekey frame
// carries the new epoch and ranks: a frame of the old world replayed
// afterwards fails authentication (or, on a plain link, the epoch check).
// Each lane then sends its message again under the new keys and reads the
// peer's (key confirmation), so that the two ends agree on the outcome.

var (
	_ transport.RekeyableLink = (*link)(nil)
	_ transport.RekeyableLink = (*lanedLink)(nil)
)

// Keepable reports whether the link can be moved into another world
// (linkutil.Base.Intact).
func (l *link) Keepable() bool { return l.Intact(&l.wmu, &l.rmu, &l.pending) }

// Keepable reports whether every lane can be moved into another world.
func (l *lanedLink) Keepable() bool {
	if l.closed.Load() || l.broken.Load() != nil || l.rstripes > 1 {
		return false
	}
	for _, ln := range l.lanes {
		if !ln.Keepable() {
			return false
		}
	}
	return true
}

// Rekey moves the link into world w, where the peer is rank peer.
func (l *link) Rekey(ctx context.Context, w transport.World, peer int) error {
	return rekeyLanes(ctx, []*link{l}, w, peer)
}

// Rekey moves every lane of the link into world w, where the peer is rank
// peer.
func (l *lanedLink) Rekey(ctx context.Context, w transport.World, peer int) error {
	if err := l.failed("rekey"); err != nil {
		return err
	}
	return rekeyLanes(ctx, l.lanes, w, peer)
}

// rekeyLanes sends every lane's rekey frame, then reads and checks every
// lane's answer, and only then moves the lanes: a failure leaves them all
// in the old world (and the caller closes the link).
func rekeyLanes(ctx context.Context, lanes []*link, w transport.World, peer int) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if peer < 0 || peer >= w.Size() || peer == w.Rank {
		return fmt.Errorf("tcp: rekey to rank %d in a world of %d where this end is rank %d", peer, w.Size(), w.Rank)
	}
	job := transport.JobHash(w.JobID)
	mine := make([]transport.RekeyMsg, len(lanes))
	for k, ln := range lanes {
		if job != ln.job {
			return ln.PeerErr("rekey", fmt.Errorf("%w: the link belongs to another job", transport.ErrRekey))
		}
		mine[k] = transport.NewRekeyMsg(w, peer, k)
		var b [transport.RekeyMsgSize]byte
		mine[k].Encode(b[:])
		mine[k].MAC = framesec.RekeyMAC(&ln.chain, transport.MACInput(b[:]))
		if err := transport.SendRekey(ctx, ln, &mine[k]); err != nil {
			return err
		}
	}
	keys := make([]framesec.Keys, len(lanes))
	for k, ln := range lanes {
		theirs, err := transport.RecvRekey(ctx, ln)
		if err != nil {
			return err
		}
		if err := transport.CheckRekey(&mine[k], &theirs); err != nil {
			return ln.PeerErr("rekey", err)
		}
		var b [transport.RekeyMsgSize]byte
		theirs.Encode(b[:])
		want := framesec.RekeyMAC(&ln.chain, transport.MACInput(b[:]))
		if !hmac.Equal(want[:], theirs.MAC[:]) {
			return ln.PeerErr("rekey", fmt.Errorf("%w: the peer's rekey message does not verify", transport.ErrRekey))
		}
		if keys[k], err = framesec.Rekey(ln.sec, &ln.chain, job, &mine[k], &theirs); err != nil {
			return ln.PeerErr("rekey", fmt.Errorf("%w: %v", transport.ErrRekey, err))
		}
	}
	addr := w.Addrs[peer]
	theirs := make([]transport.RekeyMsg, len(lanes))
	for k, ln := range lanes {
		if err := ln.moveTo(w.Epoch, w.Rank, peer, addr, keys[k]); err != nil {
			return err
		}
		// Key confirmation: the same message again, as the first frame of
		// the new world under the new keys. An end whose re-key failed
		// has closed the link, so the other cannot finish its own and
		// keep a link its peer dropped.
		if err := transport.SendRekey(ctx, ln, &mine[k]); err != nil {
			return err
		}
	}
	for k, ln := range lanes {
		var err error
		if theirs[k], err = transport.RecvRekey(ctx, ln); err != nil {
			return err
		}
		if err := transport.CheckRekey(&mine[k], &theirs[k]); err != nil {
			return ln.PeerErr("rekey", err)
		}
	}
	return nil
}

// moveTo makes the link one of world epoch, between this end at rank self
// and the peer at rank peer (addr: its address, "" to keep the one known),
// with keys.
func (l *link) moveTo(epoch uint64, self, peer int, addr string, keys framesec.Keys) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.rmu.Lock()
	defer l.rmu.Unlock()
	l.epoch, l.self = epoch, uint32(self)
	l.PeerRank = peer
	if addr != "" {
		l.Addr = addr
	}
	l.chain = keys.Chain
	l.wseal, l.rseal = nil, nil
	if err := l.initSealing(keys); err != nil {
		l.WBroken, l.RBroken = err, err
		return l.PeerErr("rekey", err)
	}
	return nil
}
