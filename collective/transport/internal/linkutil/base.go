package linkutil

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Base is the state every link keeps beside its data path. A link embeds it
// by value; its fields are the link's own, guarded as each says.
type Base struct {
	PeerRank  int           // the peer's rank; fixed
	Addr      string        // the peer's address, for errors; fixed
	IOTimeout time.Duration // how long the peer may stay silent; fixed

	// Closed is set once by the link's Close; every call checks it first.
	Closed atomic.Bool
	// WBroken is the first send failure that left the stream unusable (half
	// a frame may have gone out); guarded by the link's send lock.
	WBroken error
	// RBroken is the first receive failure that lost the stream's position;
	// guarded by the link's receive lock.
	RBroken error
	// What changes on every frame (the payload still pending, the buffers'
	// positions) stays in the link's own send and receive sections: here,
	// beside Closed, which both directions read on every call, a write per
	// frame would move this cache line between the sending and the
	// receiving core.
}

// Peer is the rank at the other end (transport.Link).
func (b *Base) Peer() int { return b.PeerRank }

// RemoteAddr is the peer's address (transport.Link).
func (b *Base) RemoteAddr() string { return b.Addr }

// PeerErr is err as the failure of op ("send", "recv") on the link to this
// peer: every error a link returns names the peer, so that a collective's
// caller learns which rank failed.
func (b *Base) PeerErr(op string, err error) error {
	return &transport.PeerError{Rank: b.PeerRank, Addr: b.Addr, Op: op, Err: err}
}

// SendReady is the check that opens a Send of h and payload, made under the
// send lock: a frame the caller got wrong (transport.CheckOutgoing), a
// closed link, a stream a failed send left unusable and an ended context
// each fail the call before anything is written.
func (b *Base) SendReady(ctx context.Context, h *transport.Header, payload []byte) error {
	if err := transport.CheckOutgoing(h, payload); err != nil {
		return b.PeerErr("send", err)
	}
	return b.SendOpen(ctx)
}

// SendOpen is SendReady without the frame's check, for a send whose frame
// was checked by its caller (a stripe of a frame that a link of several
// connections spreads over them): a closed link, a stream a failed send
// left unusable and an ended context fail it. Made under the send lock.
func (b *Base) SendOpen(ctx context.Context) error {
	if b.Closed.Load() {
		return b.PeerErr("send", transport.ErrLinkClosed)
	}
	if b.WBroken != nil {
		return b.PeerErr("send", b.WBroken)
	}
	if err := ctx.Err(); err != nil {
		return b.PeerErr("send", err)
	}
	return nil
}

// SendFailed records a send failure that may have left part of a frame in
// the stream, so that later sends fail with it too, and returns it for the
// caller. After Close every call reports ErrLinkClosed anyway, so that one
// is not recorded.
func (b *Base) SendFailed(err error) error {
	if err != transport.ErrLinkClosed {
		b.WBroken = err
	}
	return b.PeerErr("send", err)
}

// RecvReady fails a receive on a closed link or one whose stream position is
// lost; made under the receive lock.
func (b *Base) RecvReady() error {
	if b.Closed.Load() {
		return b.PeerErr("recv", transport.ErrLinkClosed)
	}
	if b.RBroken != nil {
		return b.PeerErr("recv", b.RBroken)
	}
	return nil
}

// HeaderReady is the check that opens a RecvHeader: RecvReady, the previous
// frame's payload read in full (pending, the payload bytes of the last
// header not read yet, is 0), and ctx not ended.
func (b *Base) HeaderReady(ctx context.Context, pending int) error {
	if err := b.RecvReady(); err != nil {
		return err
	}
	if pending != 0 {
		return b.PeerErr("recv", fmt.Errorf("%d payload bytes of the previous frame not read", pending))
	}
	if err := ctx.Err(); err != nil {
		return b.PeerErr("recv", err)
	}
	return nil
}

// HeaderFailed records a failed header wait and returns it for the caller.
// Nothing of a header is consumed until all of it is there, so a wait cut
// short by the context or the I/O timeout leaves the stream where it was and
// may be retried; anything else leaves the link unusable.
func (b *Base) HeaderFailed(err error) error {
	if !IsWait(err) && err != transport.ErrLinkClosed {
		b.RBroken = err
	}
	return b.PeerErr("recv", err)
}

// PayloadReady is the check that opens a RecvPayload of n bytes: RecvReady,
// n equal to pending (the payload bytes of the last header), and ctx not
// ended. done is true when
// nothing is left to read (an empty payload). An ended context breaks the
// link: the caller abandons a frame whose payload the stream still holds.
func (b *Base) PayloadReady(ctx context.Context, n, pending int) (done bool, err error) {
	if err := b.RecvReady(); err != nil {
		return false, err
	}
	if n != pending {
		return false, b.PeerErr("recv", fmt.Errorf("payload buffer of %d bytes for a frame of %d", n, pending))
	}
	if n == 0 {
		return true, nil
	}
	if err := ctx.Err(); err != nil {
		b.RBroken = err
		return false, b.PeerErr("recv", err)
	}
	return false, nil
}

// RecvFailed records a receive failure part-way through a payload (the
// stream position is lost) and returns it for the caller; ErrLinkClosed is
// not recorded, as after Close every call reports that.
func (b *Base) RecvFailed(err error) error {
	if err != transport.ErrLinkClosed {
		b.RBroken = err
	}
	return b.PeerErr("recv", err)
}

// Intact reports whether a link can be carried into another world
// (transport.RekeyableLink's Keepable): it is open, neither direction broke,
// and the last header's payload was read in full (*pending, the payload
// bytes not read yet, is 0). wmu and rmu are the link's send and receive
// locks, which guard WBroken and RBroken (and *pending); each is taken in
// turn, never both at once.
func (b *Base) Intact(wmu, rmu *sync.Mutex, pending *int) bool {
	if b.Closed.Load() {
		return false
	}
	wmu.Lock()
	wok := b.WBroken == nil
	wmu.Unlock()
	rmu.Lock()
	rok := b.RBroken == nil && *pending == 0
	rmu.Unlock()
	return wok && rok
}
