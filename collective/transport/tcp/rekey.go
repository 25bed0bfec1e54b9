package tcp

import (
	"context"
	"crypto/hmac"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
)

// Moving a link into the next world (transport.RekeyableLink): each end
// sends a rekey frame on the link's first lane under its current keys,
// carrying the new world, both ends' new ranks, a fresh nonce and a MAC
// under that lane's chaining secret; then reads the peer's, checks it and
// derives every lane's new keys from the lane's own chaining secret and
// both nonces (framesec.Rekey). The counters of the new keys start at
// zero, and every frame after the rekey frame carries the new epoch and
// ranks: a frame of the old world replayed afterwards fails authentication
// (or, on a plain link, the epoch check). Each end then sends its message
// again on the first lane under the new keys and reads the peer's (key
// confirmation), so that the two ends agree on the outcome.

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

// rekeyLanes moves the lanes of one link into world w in a single
// exchange on the first lane: this end sends its rekey frame there, reads
// and checks the peer's, derives every lane's new keys from that lane's own
// chaining secret and the two messages (with the lane's index in the
// derivation, framesec.Rekey), moves all the lanes, and then confirms on
// the first lane under its new keys. A failure before the move leaves the
// lanes in the old world (and the caller closes the link).
//
// The other lanes need no frames of their own: they carry only the stripes
// of frames whose headers go on the first lane, in order, so once the
// peer's rekey frame is the next frame there, neither end has a stripe of
// the old world under way on any lane (a link with one half-read is not
// Keepable, and one the peer sent after frames this end never read fails
// the first lane's exchange, which finds a data frame where the rekey frame
// was due). A stripe of the old world replayed on another lane afterwards
// fails authentication under the lane's new keys, as on the first. With one
// exchange per link instead of one per lane, a world change on 4-lane links
// takes a quarter of the frames, and of their system calls, which were
// most of a re-key's CPU (BenchmarkWorldChange).
func rekeyLanes(ctx context.Context, lanes []*link, w transport.World, peer int) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if peer < 0 || peer >= w.Size() || peer == w.Rank {
		return fmt.Errorf("tcp: rekey to rank %d in a world of %d where this end is rank %d", peer, w.Size(), w.Rank)
	}
	job := transport.JobHash(w.JobID)
	for _, ln := range lanes {
		if job != ln.job {
			return ln.PeerErr("rekey", fmt.Errorf("%w: the link belongs to another job", transport.ErrRekey))
		}
	}
	first := lanes[0]
	mine := transport.NewRekeyMsg(w, peer, 0)
	var b [transport.RekeyMsgSize]byte
	mine.Encode(b[:])
	mine.MAC = framesec.RekeyMAC(&first.chain, transport.MACInput(b[:]))
	if err := transport.SendRekey(ctx, first, &mine); err != nil {
		return err
	}
	theirs, err := transport.AwaitRekey(ctx, first)
	if err != nil {
		return err
	}
	if err := transport.CheckRekey(&mine, &theirs); err != nil {
		return first.PeerErr("rekey", err)
	}
	theirs.Encode(b[:])
	want := framesec.RekeyMAC(&first.chain, transport.MACInput(b[:]))
	if !hmac.Equal(want[:], theirs.MAC[:]) {
		return first.PeerErr("rekey", fmt.Errorf("%w: the peer's rekey message does not verify", transport.ErrRekey))
	}
	keys := make([]framesec.Keys, len(lanes))
	for k, ln := range lanes {
		m, t := mine, theirs
		m.Lane, t.Lane = uint32(k), uint32(k)
		if keys[k], err = framesec.Rekey(ln.sec, &ln.chain, job, &m, &t); err != nil {
			return ln.PeerErr("rekey", fmt.Errorf("%w: %v", transport.ErrRekey, err))
		}
	}
	addr := w.Addrs[peer]
	for k, ln := range lanes {
		if err := ln.moveTo(w.Epoch, w.Rank, peer, addr, keys[k]); err != nil {
			return err
		}
	}
	// Key confirmation: the same message again, as the first frame of the
	// new world under the new keys. An end whose re-key failed has closed
	// the link, so the other cannot finish its own and keep a link its
	// peer dropped.
	if err := transport.SendRekey(ctx, first, &mine); err != nil {
		return err
	}
	confirm, err := transport.RecvRekey(ctx, first)
	if err != nil {
		return err
	}
	if err := transport.CheckRekey(&mine, &confirm); err != nil {
		return first.PeerErr("rekey", err)
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
