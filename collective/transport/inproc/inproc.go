// Package inproc is a transport whose links are Go channels inside one process:
// for testing code that runs on communicators without sockets, and for running
// several ranks in one process. Frames are copied on send, so senders may reuse
// their buffers at once, as with a network transport.
package inproc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// Config tunes a mesh.
type Config struct {
	JobID     string
	Epoch     uint64
	IOTimeout time.Duration // a blocked call fails with ErrPeerTimeout after this long; 0 means 30 s
	Depth     int           // frames a link buffers before Send blocks; 0 means 64
}

type frame struct {
	h       transport.Header
	payload []byte
}

// end is one rank's side of a pair: closing it tells the other side.
type end struct {
	once   sync.Once
	closed chan struct{}
}

func (e *end) close() { e.once.Do(func() { close(e.closed) }) }

type link struct {
	cfg        Config
	rank, peer int
	jobHash    uint64
	out, in    chan frame
	self, far  *end
	cur        frame
	sendMu     sync.Mutex
}

// Mesh returns, for each of p ranks, its links to every other rank
// (mesh[i][j] leads from rank i to rank j; mesh[i][i] is nil).
func Mesh(cfg Config, p int) [][]transport.Link {
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 30 * time.Second
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 64
	}
	jh := transport.JobHash(cfg.JobID)
	mesh := make([][]transport.Link, p)
	for i := range mesh {
		mesh[i] = make([]transport.Link, p)
	}
	for i := 0; i < p; i++ {
		for j := i + 1; j < p; j++ {
			ij, ji := make(chan frame, cfg.Depth), make(chan frame, cfg.Depth)
			ei, ej := &end{closed: make(chan struct{})}, &end{closed: make(chan struct{})}
			mesh[i][j] = &link{cfg: cfg, rank: i, peer: j, jobHash: jh, out: ij, in: ji, self: ei, far: ej}
			mesh[j][i] = &link{cfg: cfg, rank: j, peer: i, jobHash: jh, out: ji, in: ij, self: ej, far: ei}
		}
	}
	return mesh
}

func (l *link) Peer() int          { return l.peer }
func (l *link) RemoteAddr() string { return fmt.Sprintf("inproc:%d", l.peer) }

func (l *link) fail(op string, err error) error {
	return &transport.PeerError{Rank: l.peer, Addr: l.RemoteAddr(), Op: op, Err: err}
}

func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	if int(h.Length) != len(payload) {
		return fmt.Errorf("inproc: header length %d for a payload of %d bytes", h.Length, len(payload))
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	f := frame{h: *h, payload: append([]byte(nil), payload...)}
	f.h.JobID, f.h.Epoch, f.h.Sender = l.jobHash, l.cfg.Epoch, uint32(l.rank)
	t := time.NewTimer(l.cfg.IOTimeout)
	defer t.Stop()
	select {
	case <-l.self.closed:
		return l.fail("send", transport.ErrLinkClosed)
	case <-l.far.closed:
		return l.fail("send", transport.ErrPeerClosed)
	default:
	}
	select {
	case l.out <- f:
		return nil
	case <-l.self.closed:
		return l.fail("send", transport.ErrLinkClosed)
	case <-l.far.closed:
		return l.fail("send", transport.ErrPeerClosed)
	case <-ctx.Done():
		return l.fail("send", ctx.Err())
	case <-t.C:
		return l.fail("send", transport.ErrPeerTimeout)
	}
}

func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	select {
	case <-l.self.closed:
		return l.fail("recv", transport.ErrLinkClosed)
	case f := <-l.in:
		return l.accept(f, h)
	default:
	}
	t := time.NewTimer(l.cfg.IOTimeout)
	defer t.Stop()
	select {
	case f := <-l.in:
		return l.accept(f, h)
	case <-l.self.closed:
		return l.fail("recv", transport.ErrLinkClosed)
	case <-l.far.closed:
		// Frames sent before the close are still delivered.
		select {
		case f := <-l.in:
			return l.accept(f, h)
		default:
			return l.fail("recv", transport.ErrPeerClosed)
		}
	case <-ctx.Done():
		return l.fail("recv", ctx.Err())
	case <-t.C:
		return l.fail("recv", transport.ErrPeerTimeout)
	}
}

func (l *link) accept(f frame, h *transport.Header) error {
	if err := transport.CheckOrigin(&f.h, l.jobHash, l.cfg.Epoch, l.peer); err != nil {
		return l.fail("recv", err)
	}
	l.cur = f
	*h = f.h
	return nil
}

func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	if len(p) != len(l.cur.payload) {
		return fmt.Errorf("inproc: payload of %d bytes read into %d", len(l.cur.payload), len(p))
	}
	copy(p, l.cur.payload)
	l.cur = frame{}
	return nil
}

func (l *link) Close() error {
	l.self.close()
	return nil
}
