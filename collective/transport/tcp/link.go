package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// smallFrame is the largest payload copied behind the header into one write;
// past it the copy costs more than a writev of two buffers.
const smallFrame = 32 << 10

// link is one authenticated connection of a world. It implements transport.Link.
type link struct {
	conn      *net.TCPConn
	peer      int
	addr      string
	job       uint64
	epoch     uint64
	self      uint32
	ioTimeout time.Duration

	closed atomic.Bool

	// Send side, guarded by wmu.
	wmu     sync.Mutex
	wbuf    []byte // header + small payload, one write
	whdr    [transport.HeaderSize]byte
	bufsArr [2][]byte
	bufs    net.Buffers // writev of header + large payload; backed by bufsArr
	wbroken error       // first send failure: the stream may hold half a frame
	wwake   transport.Waker

	// Receive side, one goroutine at a time; rmu only orders it with Close.
	rmu     sync.Mutex
	br      *bufio.Reader
	pending int   // payload bytes of the last header not read yet
	rbroken error // first receive failure: the stream position is lost
	rwake   transport.Waker
}

func newLink(c *net.TCPConn, peer int, addr string, job, epoch uint64, self int, cfg *Config) *link {
	if addr == "" {
		addr = c.RemoteAddr().String()
	}
	l := &link{
		conn:      c,
		peer:      peer,
		addr:      addr,
		job:       job,
		epoch:     epoch,
		self:      uint32(self),
		ioTimeout: cfg.IOTimeout,
		wbuf:      make([]byte, transport.HeaderSize+smallFrame),
		br:        bufio.NewReaderSize(c, cfg.ReadBufferSize),
	}
	l.wwake.Init(func(t time.Time) { _ = c.SetWriteDeadline(t) })
	l.rwake.Init(func(t time.Time) { _ = c.SetReadDeadline(t) })
	return l
}

func (l *link) Peer() int          { return l.peer }
func (l *link) RemoteAddr() string { return l.addr }

// Close tears the connection down; blocked calls wake with ErrLinkClosed.
func (l *link) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	err := l.conn.Close()
	// The calls in flight return promptly now; then drop the context watches, so
	// a long-lived context does not keep the link (and its buffers) alive.
	l.wmu.Lock()
	l.wwake.Release()
	l.wmu.Unlock()
	l.rmu.Lock()
	l.rwake.Release()
	l.rmu.Unlock()
	return err
}

func (l *link) perr(op string, err error) error {
	return &transport.PeerError{Rank: l.peer, Addr: l.addr, Op: op, Err: err}
}

// ioCall is the state of one blocking call: its context, and whether the
// context's deadline (rather than the I/O timeout) is the one set on the
// connection.
type ioCall struct {
	ctx      context.Context
	ctxBound bool
}

// arm sets the deadline for a call and watches its context. It fails, before
// any I/O, if the context has ended: checking after the deadline is set
// catches a context whose watch fired just before and whose past deadline the
// new one would otherwise have undone.
func (l *link) arm(w *transport.Waker, ctx context.Context) (ioCall, error) {
	c := ioCall{ctx: ctx}
	w.Watch(ctx)
	l.setCallDeadline(w, &c)
	return c, ctx.Err()
}

func (l *link) setCallDeadline(w *transport.Waker, c *ioCall) {
	dl := time.Now().Add(l.ioTimeout)
	c.ctxBound = false
	if cd, ok := c.ctx.Deadline(); ok && !cd.After(dl) {
		dl, c.ctxBound = cd, true
	}
	w.SetDeadline(dl)
}

// extend restarts the silence timer after a timeout that followed progress, so
// IOTimeout bounds silence rather than the duration of a long transfer.
func (l *link) extend(w *transport.Waker, c *ioCall) bool {
	if c.ctxBound || c.ctx.Err() != nil {
		return false
	}
	l.setCallDeadline(w, c)
	// As in arm: the context may have ended just before the new deadline.
	return c.ctx.Err() == nil
}

// classify maps an I/O error to the transport's sentinel errors.
func (l *link) classify(c *ioCall, err error) error {
	if l.closed.Load() {
		return transport.ErrLinkClosed
	}
	var fe *transport.FrameError
	if errors.As(err, &fe) {
		return err
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := c.ctx.Err(); cerr != nil {
			return cerr
		}
		if c.ctxBound {
			return context.DeadlineExceeded
		}
		return transport.ErrPeerTimeout
	}
	if cerr := c.ctx.Err(); cerr != nil && errors.Is(err, net.ErrClosed) {
		return cerr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed) {
		return transport.ErrPeerClosed
	}
	return &brokenError{err}
}

func isWait(err error) bool {
	return err == transport.ErrPeerTimeout || err == context.Canceled || err == context.DeadlineExceeded
}

// brokenError is a connection failure other than a clean close (a host
// unreachable, a keepalive timeout): it is ErrPeerClosed for callers that only
// ask whether the peer is gone, and keeps the system error for the message.
type brokenError struct{ err error }

func (e *brokenError) Error() string   { return "connection broke: " + e.err.Error() }
func (e *brokenError) Unwrap() []error { return []error{transport.ErrPeerClosed, e.err} }

// Send writes one frame in one system call. The header is encoded from a copy,
// so the caller's h is left as it was.
func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	if err := transport.CheckOutgoing(h, payload); err != nil {
		return l.perr("send", err)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Load() {
		return l.perr("send", transport.ErrLinkClosed)
	}
	if l.wbroken != nil {
		return l.perr("send", l.wbroken)
	}
	c, err := l.arm(&l.wwake, ctx)
	if err != nil {
		return l.perr("send", err)
	}
	hh := *h
	hh.JobID, hh.Epoch, hh.Sender = l.job, l.epoch, l.self

	if len(payload) <= smallFrame {
		buf := l.wbuf[:transport.HeaderSize+len(payload)]
		hh.Encode(buf)
		copy(buf[transport.HeaderSize:], payload)
		err = l.writeAll(&c, buf)
	} else {
		hh.Encode(l.whdr[:])
		l.bufsArr[0], l.bufsArr[1] = l.whdr[:], payload
		l.bufs = l.bufsArr[:]
		err = l.writeBuffers(&c)
		// Drop the reference so the link does not pin the caller's buffer.
		l.bufsArr[1], l.bufs = nil, nil
	}
	if err != nil {
		l.wbroken = l.classify(&c, err)
		return l.perr("send", l.wbroken)
	}
	return nil
}

func (l *link) writeAll(c *ioCall, b []byte) error {
	for {
		n, err := l.conn.Write(b)
		if err == nil {
			return nil
		}
		b = b[n:]
		if n == 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !l.extend(&l.wwake, c) {
			return err
		}
	}
}

func (l *link) writeBuffers(c *ioCall) error {
	for {
		n, err := l.bufs.WriteTo(l.conn)
		if err == nil {
			return nil
		}
		if n == 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !l.extend(&l.wwake, c) {
			return err
		}
	}
}

// RecvHeader reads and checks the next frame header.
func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.recvReady(); err != nil {
		return err
	}
	if l.pending != 0 {
		return l.perr("recv", fmt.Errorf("%d payload bytes of the previous frame not read", l.pending))
	}
	c, err := l.arm(&l.rwake, ctx)
	if err != nil {
		return l.perr("recv", err)
	}
	if err = l.readHeader(&c, h); err != nil {
		err = l.classify(&c, err)
		// Peek consumes nothing, so a header wait cut short by the context or the
		// I/O timeout leaves the stream where it was and may be retried; anything
		// else leaves it unusable.
		if !isWait(err) {
			l.rbroken = err
		}
		return l.perr("recv", err)
	}
	l.pending = int(h.Length)
	return nil
}

func (l *link) recvReady() error {
	if l.closed.Load() {
		return l.perr("recv", transport.ErrLinkClosed)
	}
	if l.rbroken != nil {
		return l.perr("recv", l.rbroken)
	}
	return nil
}

func (l *link) readHeader(c *ioCall, h *transport.Header) error {
	have := 0
	for {
		b, err := l.br.Peek(transport.HeaderSize)
		if err == nil {
			if err := transport.DecodeHeader(b, h); err != nil {
				var fe *transport.FrameError
				if errors.As(err, &fe) {
					fe.Peer = l.peer
				}
				return err
			}
			if err := transport.CheckOrigin(h, l.job, l.epoch, l.peer); err != nil {
				return err
			}
			_, _ = l.br.Discard(transport.HeaderSize)
			return nil
		}
		if len(b) <= have || !errors.Is(err, os.ErrDeadlineExceeded) || !l.extend(&l.rwake, c) {
			return err
		}
		have = len(b)
	}
}

// RecvPayload reads the payload announced by the last header into p. Once the
// read buffer is drained, bufio hands large reads straight to the socket, so big
// payloads land in p without an intermediate copy.
func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.recvReady(); err != nil {
		return err
	}
	if len(p) != l.pending {
		return l.perr("recv", fmt.Errorf("payload buffer of %d bytes for a frame of %d", len(p), l.pending))
	}
	if len(p) == 0 {
		return nil
	}
	c, err := l.arm(&l.rwake, ctx)
	if err != nil {
		return l.perr("recv", err)
	}
	if err = l.readFull(&c, p); err != nil {
		l.rbroken = l.classify(&c, err)
		return l.perr("recv", l.rbroken)
	}
	l.pending = 0
	return nil
}

func (l *link) readFull(c *ioCall, p []byte) error {
	n, progress := 0, 0
	for n < len(p) {
		m, err := l.br.Read(p[n:])
		n += m
		progress += m
		if err != nil {
			if n == len(p) {
				// The payload is complete; whatever follows it shows on the next call.
				return nil
			}
			if progress == 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !l.extend(&l.rwake, c) {
				if errors.Is(err, io.EOF) {
					return io.ErrUnexpectedEOF
				}
				return err
			}
			progress = 0
		}
	}
	return nil
}
