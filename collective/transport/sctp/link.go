package sctp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/sctp"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
)

// closeLinger bounds how long Close waits for what is still queued to be
// acknowledged, so that frames sent before Close are delivered, as a socket's
// close would deliver them, without a dead peer holding Close up.
const closeLinger = 250 * time.Millisecond

// link is one association of a world. It implements transport.Link.
type link struct {
	// The peer, the I/O timeout, Closed, each direction's first failure
	// (WBroken under wmu, RBroken under rmu).
	linkutil.Base

	c          *sconn
	job, epoch uint64
	self       uint32
	unit       int // frame bytes (header and payload) per message: messageBytes less a tag when sealed
	probe      time.Duration
	sendBuffer uint64

	closing chan struct{} // closed by Close: wakes a Send waiting for room

	// Flow control. pion drops DATA that finds the peer's receive buffer full
	// and recovers only when its retransmission timer fires (a second or
	// more), and it announces no window opening when the application reads.
	// So the receiver reports on stream 1 how many message bytes it has read,
	// and the sender keeps at most window bytes unread at the peer: half its
	// receive window, which therefore never fills. On a sealed link the
	// reports are sealed too, under keys of their own (a forged report could
	// otherwise stall the sender or let it overrun the peer's buffer).
	window     uint64
	peerRead   atomic.Uint64 // message bytes the peer reports having read
	creditErr  atomic.Pointer[error]
	credited   chan struct{}    // peerRead moved, or the reports ended
	creditDone chan struct{}    // the report reader has returned
	creditOpen *framesec.Sealer // nil: plain reports; used by readCredits only

	// Send side, guarded by wmu.
	wmu      sync.Mutex
	wbuf     []byte           // one message: the header and the start of the payload (sealed: and its tag)
	wseal    *framesec.Sealer // nil: plain frames
	wsent    uint64           // message bytes sent
	released chan struct{}    // the queue fell below its threshold

	// Receive side, one goroutine at a time; rmu orders it with Close.
	rmu        sync.Mutex
	rbuf       []byte // the frame's first message; sealed frames: each message
	rseal      *framesec.Sealer
	roff, rend int // payload bytes of the frame still in rbuf
	pending    int // payload bytes of the last header not read yet
	rwake      transport.Waker
	rread      uint64           // message bytes read
	reported   uint64           // rread as last reported to the peer
	creditSeal *framesec.Sealer // nil: plain reports
	cbuf       [creditReportSize + framesec.TagSize]byte
}

// creditReportSize is a flow-control report's size before its tag: the
// message bytes read so far, little endian.
const creditReportSize = 8

func newLink(c *sconn, peer int, addr string, job, epoch uint64, self int, cfg *Config, keys framesec.Keys) *link {
	if addr == "" {
		addr = c.remote
	}
	l := &link{
		Base:       linkutil.Base{PeerRank: peer, Addr: addr, IOTimeout: cfg.IOTimeout},
		c:          c,
		job:        job,
		epoch:      epoch,
		self:       uint32(self),
		probe:      cfg.ProbeInterval,
		sendBuffer: uint64(cfg.SendBuffer),
		closing:    make(chan struct{}),
		unit:       messageBytes,
		wbuf:       make([]byte, messageBytes),
		released:   make(chan struct{}, 1),
		rbuf:       make([]byte, messageBytes),
		credited:   make(chan struct{}, 1),
		creditDone: make(chan struct{}),
	}
	if keys.Security != transport.SecurityPlain {
		// A message, tag included, stays within messageBytes (what pion
		// sends as one message).
		l.unit = messageBytes - framesec.TagSize
		var err error
		if l.wseal, err = framesec.NewSealer(keys.Security, keys.Send); err == nil {
			l.rseal, err = framesec.NewSealer(keys.Security, keys.Recv)
		}
		var credit framesec.Keys
		if err == nil {
			credit, err = keys.Sub("sctp flow control")
		}
		if err == nil {
			l.creditSeal, err = framesec.NewSealer(keys.Security, credit.Send)
		}
		if err == nil {
			l.creditOpen, err = framesec.NewSealer(keys.Security, credit.Recv)
		}
		if err != nil {
			// Cannot happen with keys from the handshake; if it does, the
			// link refuses to carry frames rather than carry them unprotected.
			l.WBroken, l.RBroken = err, err
		}
	}
	// The peer's receive window as it announced it when the association started.
	l.window = uint64(max(c.assoc.RWND(), 4*messageBytes)) / 2
	c.stream.SetBufferedAmountLowThreshold(l.sendBuffer / 2)
	c.stream.OnBufferedAmountLow(func() {
		select {
		case l.released <- struct{}{}:
		default:
		}
	})
	stream := c.stream
	l.rwake.Init(func(t time.Time) { _ = stream.SetReadDeadline(t) })
	go l.readCredits()
	return l
}

// readCredits takes the peer's reports of what it has read, until the
// association ends.
func (l *link) readCredits() {
	defer close(l.creditDone)
	want := creditReportSize
	if l.creditOpen != nil {
		want += framesec.TagSize
	}
	var b [creditReportSize + framesec.TagSize + 1]byte
	for {
		n, err := l.c.credit.Read(b[:])
		if err == nil && n != want {
			err = &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("flow-control report of %d bytes, want %d", n, want)}
		}
		report := b[:n]
		if err == nil && l.creditOpen != nil {
			if report, err = l.creditOpen.OpenInPlace(report); err != nil {
				err = fmt.Errorf("flow-control report: %w", err)
			}
		}
		if err == nil {
			v := binary.LittleEndian.Uint64(report)
			if v < l.peerRead.Load() {
				err = &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("flow-control report %d went backwards", v)}
			} else {
				l.peerRead.Store(v)
			}
		}
		if err != nil {
			l.creditErr.Store(&err)
		}
		select {
		case l.credited <- struct{}{}:
		default:
		}
		if err != nil {
			return
		}
	}
}

// reportRead tells the peer how much this side has read, each time a
// quarter window more has been: often enough that the sender never waits for
// a report while this side waits for data (it waits only once a whole window
// minus a message is unreported).
func (l *link) reportRead(n int) {
	l.rread += uint64(n)
	if l.rread-l.reported < l.window/4 {
		return
	}
	binary.LittleEndian.PutUint64(l.cbuf[:], l.rread)
	report := l.cbuf[:creditReportSize]
	if l.creditSeal != nil {
		report = l.creditSeal.SealTo(l.cbuf[:], report)
	}
	// A failure shows on the data stream too.
	_, _ = l.c.credit.Write(report)
	l.reported = l.rread
}

// Close tears the link down: blocked calls return with ErrLinkClosed at once;
// frames already sent get closeLinger to be acknowledged; then the
// association is aborted, which the peer sees, after reading what it
// received, as ErrPeerClosed.
func (l *link) Close() error {
	if l.Closed.Swap(true) {
		return nil
	}
	close(l.closing)
	_ = l.c.stream.SetReadDeadline(time.Unix(1, 0))
	l.wmu.Lock()
	l.c.stream.SetBufferedAmountLowThreshold(0)
	timer := time.NewTimer(closeLinger)
	for l.c.stream.BufferedAmount() > 0 {
		select {
		case <-l.released:
			continue
		case <-timer.C:
		}
		break
	}
	timer.Stop()
	l.wmu.Unlock()
	l.rmu.Lock()
	l.rwake.Release()
	_ = l.c.stream.SetReadDeadline(time.Time{})
	l.rmu.Unlock()
	l.c.close()
	<-l.creditDone
	return nil
}

// gone classifies a failed stream operation.
func (l *link) gone(err error) error {
	return l.Failure(err, errors.Is(err, io.EOF) || errors.Is(err, sctp.ErrStreamClosed), "association")
}

// ---- sending ----

// Send queues one frame as SCTP messages. It waits while the link's queue of
// unacknowledged bytes is full; the header is encoded from a copy, so the
// caller's h is left as it was.
func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.SendReady(ctx, h, payload); err != nil {
		return err
	}
	hh := *h
	hh.JobID, hh.Epoch, hh.Sender = l.job, l.epoch, l.self
	hh.Encode(l.wbuf)
	first := min(len(payload), l.unit-transport.HeaderSize)
	copy(l.wbuf[transport.HeaderSize:], payload[:first])
	err := l.write(ctx, l.wbuf[:transport.HeaderSize+first])
	if err != nil {
		// Nothing of the frame was queued: the stream is intact.
		if linkutil.IsWait(err) {
			return l.PeerErr("send", err)
		}
	} else {
		for off := first; off < len(payload) && err == nil; off += l.unit {
			err = l.write(ctx, payload[off:min(off+l.unit, len(payload))])
		}
	}
	if err != nil {
		return l.SendFailed(err)
	}
	return nil
}

// write queues one message once the queue has room. The wait is bounded by
// IOTimeout of no acknowledgement at all. A sealed link seals msg into wbuf
// (msg may be the start of wbuf) only once there is room, so a wait cut
// short has consumed no nonce and the stream stays intact.
func (l *link) write(ctx context.Context, msg []byte) error {
	size := uint64(len(msg))
	if l.wseal != nil {
		size += framesec.TagSize
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if l.Closed.Load() {
			return transport.ErrLinkClosed
		}
		if errp := l.creditErr.Load(); errp != nil {
			return l.gone(*errp)
		}
		unread := l.wsent - l.peerRead.Load()
		queued := l.c.stream.BufferedAmount()
		if (unread == 0 || unread+size <= l.window) && (queued == 0 || queued+size <= l.sendBuffer) {
			break
		}
		dl, ctxBound := l.Deadline(ctx)
		if timer == nil {
			timer = time.NewTimer(time.Until(dl))
		} else {
			timer.Reset(time.Until(dl))
		}
		select {
		case <-l.released:
			// Progress: the silence bound starts again.
		case <-l.credited:
		case <-ctx.Done():
			return ctx.Err()
		case <-l.closing:
			return transport.ErrLinkClosed
		case <-timer.C:
			if l.c.stream.BufferedAmount() < queued || l.wsent-l.peerRead.Load() < unread {
				continue
			}
			if ctxBound {
				return context.DeadlineExceeded
			}
			return transport.ErrPeerTimeout
		}
	}
	if l.wseal != nil {
		msg = l.wseal.SealTo(l.wbuf, msg)
	}
	if _, err := l.c.stream.Write(msg); err != nil {
		return l.gone(err)
	}
	l.wsent += uint64(len(msg))
	return nil
}

// ---- receiving ----

// RecvHeader reads and checks the next frame header (with the first message
// of the frame).
func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.HeaderReady(ctx, l.pending); err != nil {
		return err
	}
	// A read cut short by the context or the I/O timeout consumed nothing
	// (HeaderFailed).
	n, err := l.read(ctx, l.rbuf)
	if err != nil {
		return l.HeaderFailed(err)
	}
	msg := l.rbuf[:n]
	if l.rseal != nil {
		// Verified (and decrypted) before anything of it is used.
		if msg, err = l.rseal.OpenInPlace(msg); err != nil {
			return l.RecvFailed(l.Failure(err, false, "association"))
		}
	}
	if err := l.parseHeader(msg, h); err != nil {
		l.RBroken = err
		return l.PeerErr("recv", err)
	}
	l.reportRead(n)
	l.roff, l.rend, l.pending = transport.HeaderSize, len(msg), int(h.Length)
	return nil
}

// parseHeader checks a frame's first message.
func (l *link) parseHeader(msg []byte, h *transport.Header) error {
	if len(msg) < transport.HeaderSize {
		return &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("message of %d bytes cannot hold a header", len(msg))}
	}
	if err := transport.DecodeFrom(msg, h, l.job, l.epoch, l.PeerRank); err != nil {
		return err
	}
	if want := transport.HeaderSize + min(int(h.Length), l.unit-transport.HeaderSize); len(msg) != want {
		return &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("first message of a %d-byte frame holds %d bytes, want %d", h.Length, len(msg), want)}
	}
	return nil
}

// RecvPayload reads the payload announced by the last header into p: what
// came with the header, then each further message straight into p.
func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if done, err := l.PayloadReady(ctx, len(p), l.pending); done || err != nil {
		return err
	}
	off := copy(p, l.rbuf[l.roff:l.rend])
	l.roff = l.rend
	for off < len(p) {
		want := min(l.unit, len(p)-off)
		dst := p[off : off+want]
		if l.rseal != nil {
			// A sealed message is read whole (with its tag) into rbuf and
			// verified, or decrypted, into p from there.
			dst = l.rbuf[:want+framesec.TagSize]
		}
		n, err := l.read(ctx, dst)
		if err == nil && n != len(dst) {
			err = &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("message of %d bytes where %d were due", n, len(dst))}
		}
		if err == nil && l.rseal != nil {
			if oerr := l.rseal.OpenTo(p[off:off+want], dst); oerr != nil {
				err = l.Failure(oerr, false, "association")
			}
		}
		if err != nil {
			return l.RecvFailed(err)
		}
		l.reportRead(n)
		off += want
	}
	l.pending = 0
	return nil
}

// read reads one message into b, bounded by the context's deadline and
// IOTimeout of silence. While it waits it probes the peer with a heartbeat
// every ProbeInterval: an association whose peer process is gone fails then
// (its port answers with ICMP "port unreachable"), instead of at IOTimeout.
func (l *link) read(ctx context.Context, b []byte) (int, error) {
	l.rwake.Watch(ctx)
	dl, ctxBound := l.Deadline(ctx)
	for {
		next := dl
		if p := time.Now().Add(l.probe); p.Before(next) {
			next = p
		}
		_ = l.c.stream.SetReadDeadline(next)
		if err := l.Interrupted(ctx); err != nil {
			return 0, err
		}
		n, err := l.c.stream.Read(b)
		switch {
		case err == nil:
			return n, nil
		case l.Closed.Load():
			return 0, transport.ErrLinkClosed
		case errors.Is(err, io.ErrShortBuffer):
			return 0, &transport.FrameError{Peer: l.PeerRank, Reason: fmt.Sprintf("message larger than the %d bytes due", len(b))}
		case !errors.Is(err, sctp.ErrReadDeadlineExceeded):
			return 0, l.gone(err)
		}
		if cerr := ctx.Err(); cerr != nil {
			return 0, cerr
		}
		if !time.Now().Before(dl) {
			return 0, linkutil.Expired(ctx, ctxBound)
		}
		l.c.assoc.ActiveHeartbeat()
	}
}
