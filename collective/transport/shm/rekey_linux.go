package shm

import (
	"context"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
)

// A shared-memory link moves into the next world as the network links do
// (transport.RekeyableLink): one rekey frame each way, through the ring,
// naming the new world and both ends' ranks in it; then every frame
// carries the new epoch and ranks. There are no keys to renew: the link
// stays inside one host's trust boundary (owner-only files), so its rekey
// messages carry no MAC.

var _ transport.RekeyableLink = (*link)(nil)

// Keepable reports whether the link can be moved into another world: intact
// (linkutil.Base.Intact) and its peer still there. The peer's flags live in
// the shared mapping, which Close unmaps under rmu once it has set Closed:
// they are read under rmu, and only while the link is open.
func (l *link) Keepable() bool {
	if !l.Intact(&l.wmu, &l.rmu, &l.pending) {
		return false
	}
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return !l.Closed.Load() && !l.gone()
}

// Rekey moves the link into world w, where the peer is rank peer.
func (l *link) Rekey(ctx context.Context, w transport.World, peer int) error {
	if err := w.Validate(); err != nil {
		return err
	}
	if peer < 0 || peer >= w.Size() || peer == w.Rank {
		return fmt.Errorf("shm: rekey to rank %d in a world of %d where this end is rank %d", peer, w.Size(), w.Rank)
	}
	if transport.JobHash(w.JobID) != l.job {
		return l.PeerErr("rekey", fmt.Errorf("%w: the link belongs to another job", transport.ErrRekey))
	}
	mine := transport.NewRekeyMsg(w, peer, 0)
	if err := transport.SendRekey(ctx, l, &mine); err != nil {
		return err
	}
	theirs, err := transport.AwaitRekey(ctx, l)
	if err != nil {
		return err
	}
	if err := transport.CheckRekey(&mine, &theirs); err != nil {
		return l.PeerErr("rekey", err)
	}
	l.wmu.Lock()
	l.rmu.Lock()
	l.epoch, l.self, l.PeerRank = w.Epoch, uint32(w.Rank), peer
	if a := w.Addrs[peer]; a != "" {
		l.Addr = a
	}
	l.rmu.Unlock()
	l.wmu.Unlock()
	// Confirmation, as the first frame of the new world: an end whose
	// re-key failed has closed the link, so the other cannot keep it.
	if err := transport.SendRekey(ctx, l, &mine); err != nil {
		return err
	}
	again, err := transport.RecvRekey(ctx, l)
	if err != nil {
		return err
	}
	if again != theirs {
		return l.PeerErr("rekey", fmt.Errorf("%w: the peer's confirmation differs from its rekey message", transport.ErrRekey))
	}
	return nil
}
