package inproc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
)

type frame struct {
	h       transport.Header
	payload []byte
}

// queue is one direction of a link: frames in order, bounded by the bytes of
// their payloads. One goroutine sends at a time (the link serializes them)
// and one receives.
type queue struct {
	limit int

	mu     sync.Mutex
	frames []frame
	head   int
	bytes  int
	// spare holds payload buffers the receiver is done with, for the
	// sender to reuse: a steady stream of frames allocates nothing. It
	// keeps minSpare buffers, and more while they hold at most limit bytes
	// (spareBytes, as many as may be queued), so a sender that ran ahead of
	// a slow receiver allocates only the first time it gets that far ahead.
	spare      [][]byte
	spareBytes int
	// readable and writable wake the waiting receiver and sender; a waiter
	// re-checks the queue, so a stale signal costs one more look.
	readable chan struct{}
	writable chan struct{}
}

func newQueue(limit int) *queue {
	return &queue{limit: limit, readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// tryPush queues f if it fits (or the queue is empty).
func (q *queue) tryPush(f frame) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head < len(q.frames) && q.bytes+len(f.payload) > q.limit {
		return false
	}
	q.frames = append(q.frames, f)
	q.bytes += len(f.payload)
	signal(q.readable)
	return true
}

// minSpare is how many payload buffers a queue keeps for reuse whatever
// their size.
const minSpare = 16

// payloadCopy returns a copy of p in a spare buffer, or a new one.
func (q *queue) payloadCopy(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	q.mu.Lock()
	// The last spare buffer if none is large enough: dropping a small one
	// leaves room for the large one this send makes, so that a mix of
	// frame sizes settles too.
	i := len(q.spare) - 1
	for j := i; j >= 0; j-- {
		if cap(q.spare[j]) >= len(p) {
			i = j
			break
		}
	}
	var b []byte
	if i >= 0 {
		b = q.spare[i]
		q.spareBytes -= cap(b)
		last := len(q.spare) - 1
		q.spare[i], q.spare[last] = q.spare[last], nil
		q.spare = q.spare[:last]
	}
	q.mu.Unlock()
	if cap(b) < len(p) {
		b = make([]byte, len(p))
	}
	b = b[:len(p)]
	copy(b, p)
	return b
}

// recycle keeps a payload buffer the receiver is done with.
func (q *queue) recycle(b []byte) {
	if cap(b) == 0 {
		return
	}
	q.mu.Lock()
	// minSpare buffers are kept whatever their size (a frame over the
	// limit is queued alone, and frames of a third of it pass a ring's
	// steps several at a time), and small ones up to the limit in bytes.
	if len(q.spare) < minSpare || q.spareBytes+cap(b) <= q.limit {
		q.spare = append(q.spare, b[:0])
		q.spareBytes += cap(b)
	}
	q.mu.Unlock()
}

// tryPop takes the oldest frame, if any.
func (q *queue) tryPop() (frame, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.frames) {
		return frame{}, false
	}
	f := q.frames[q.head]
	q.frames[q.head] = frame{}
	q.head++
	if q.head == len(q.frames) {
		q.frames, q.head = q.frames[:0], 0
	}
	q.bytes -= len(f.payload)
	signal(q.writable)
	return f, true
}

// end is one rank's side of a pair: closing it tells the other side.
type end struct {
	once   sync.Once
	closed chan struct{}
}

func newEnd() *end    { return &end{closed: make(chan struct{})} }
func (e *end) close() { e.once.Do(func() { close(e.closed) }) }
func (e *end) isClosed() bool {
	select {
	case <-e.closed:
		return true
	default:
		return false
	}
}

// pair is what both links of a connection share.
type pair struct {
	ab, ba *queue // a's frames to b, b's to a
	a, b   *end
}

func newPair(bufferBytes int) *pair {
	return &pair{ab: newQueue(bufferBytes), ba: newQueue(bufferBytes), a: newEnd(), b: newEnd()}
}

type link struct {
	// The peer and the I/O timeout; Closed and the broken states are not
	// used: the queues and ends keep this link's state.
	linkutil.Base

	rank      int
	jobHash   uint64
	epoch     uint64
	out, in   *queue
	self, far *end

	sendMu sync.Mutex
	// sendTimer bounds a blocked send (sendMu); made on the first one and
	// reset from then on.
	sendTimer *time.Timer
	// The receiving goroutine's state: the frame whose header was returned
	// and whose payload is not read yet, and the timer of a blocked receive.
	cur       frame
	pending   bool
	recvTimer *time.Timer
}

// armTimer starts *t (making it the first time) to fire after d. Timers'
// channels are synchronous (Go 1.23), so a stopped or reset timer never
// delivers a stale value.
func armTimer(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

// links returns the two links of p: a's (rank ra, to rank rb) and b's.
func (p *pair) links(ra, rb int, addrA, addrB string, jobHash, epoch uint64, ioTimeout time.Duration) (*link, *link) {
	la := &link{Base: linkutil.Base{PeerRank: rb, Addr: peerAddr(rb, addrB), IOTimeout: ioTimeout}, rank: ra, jobHash: jobHash, epoch: epoch, out: p.ab, in: p.ba, self: p.a, far: p.b}
	lb := &link{Base: linkutil.Base{PeerRank: ra, Addr: peerAddr(ra, addrA), IOTimeout: ioTimeout}, rank: rb, jobHash: jobHash, epoch: epoch, out: p.ba, in: p.ab, self: p.b, far: p.a}
	return la, lb
}

// peerAddr is how a link names its peer in RemoteAddr and in errors: by its
// address, or by its rank when it has none (a Mesh's links).
func peerAddr(peer int, addr string) string {
	if addr == "" {
		return fmt.Sprintf("inproc rank %d", peer)
	}
	return addr
}

func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	if err := transport.CheckOutgoing(h, payload); err != nil {
		return l.PeerErr("send", err)
	}
	if err := ctx.Err(); err != nil {
		return l.PeerErr("send", err)
	}
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	f := frame{h: *h, payload: l.out.payloadCopy(payload)}
	f.h.JobID, f.h.Epoch, f.h.Sender = l.jobHash, l.epoch, uint32(l.rank)
	var expired <-chan time.Time // armed once this call blocks
	// One defer outside the loop: a deferred call in a loop is allocated.
	defer func() {
		if expired != nil {
			l.sendTimer.Stop()
		}
	}()
	for {
		switch {
		case l.self.isClosed():
			return l.PeerErr("send", transport.ErrLinkClosed)
		case l.far.isClosed():
			return l.PeerErr("send", transport.ErrPeerClosed)
		case l.out.tryPush(f):
			return nil
		}
		if expired == nil {
			expired = armTimer(&l.sendTimer, l.IOTimeout)
		}
		select {
		case <-l.out.writable:
		case <-l.self.closed:
		case <-l.far.closed:
		case <-ctx.Done():
			return l.PeerErr("send", ctx.Err())
		case <-expired:
			return l.PeerErr("send", transport.ErrPeerTimeout)
		}
	}
}

func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	if l.pending {
		return l.PeerErr("recv", fmt.Errorf("the payload of the previous frame (%d bytes) was not read", len(l.cur.payload)))
	}
	if err := ctx.Err(); err != nil {
		return l.PeerErr("recv", err)
	}
	var expired <-chan time.Time // armed once this call blocks
	// One defer outside the loop: a deferred call in a loop is allocated.
	defer func() {
		if expired != nil {
			l.recvTimer.Stop()
		}
	}()
	for {
		if l.self.isClosed() {
			return l.PeerErr("recv", transport.ErrLinkClosed)
		}
		// Frames sent before the peer closed are still delivered.
		farClosed := l.far.isClosed()
		if f, ok := l.in.tryPop(); ok {
			return l.accept(f, h)
		}
		if farClosed {
			return l.PeerErr("recv", transport.ErrPeerClosed)
		}
		if expired == nil {
			expired = armTimer(&l.recvTimer, l.IOTimeout)
		}
		select {
		case <-l.in.readable:
		case <-l.self.closed:
		case <-l.far.closed:
		case <-ctx.Done():
			return l.PeerErr("recv", ctx.Err())
		case <-expired:
			return l.PeerErr("recv", transport.ErrPeerTimeout)
		}
	}
}

func (l *link) accept(f frame, h *transport.Header) error {
	if err := transport.CheckOrigin(&f.h, l.jobHash, l.epoch, l.PeerRank); err != nil {
		return l.PeerErr("recv", err)
	}
	l.cur, l.pending = f, true
	*h = f.h
	return nil
}

func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	if !l.pending {
		return l.PeerErr("recv", fmt.Errorf("no frame header was received"))
	}
	if len(p) != len(l.cur.payload) {
		return l.PeerErr("recv", fmt.Errorf("payload of %d bytes read into %d", len(l.cur.payload), len(p)))
	}
	copy(p, l.cur.payload)
	l.in.recycle(l.cur.payload)
	l.cur, l.pending = frame{}, false
	return nil
}

func (l *link) Close() error {
	l.self.close()
	return nil
}

// Mesh returns, for each of p ranks of the world (cfg.JobID, cfg.Epoch), its
// links to every other rank (mesh[i][j] leads from rank i to rank j;
// mesh[i][i] is nil), connected at once without handshakes.
func Mesh(cfg Config, p int) [][]transport.Link {
	cfg, _ = cfg.withDefaults() // a negative field just keeps its value
	jh := transport.JobHash(cfg.JobID)
	mesh := make([][]transport.Link, p)
	for i := range mesh {
		mesh[i] = make([]transport.Link, p)
	}
	for i := 0; i < p; i++ {
		for j := i + 1; j < p; j++ {
			li, lj := newPair(cfg.BufferBytes).links(i, j, "", "", jh, cfg.Epoch, cfg.IOTimeout)
			mesh[i][j], mesh[j][i] = li, lj
		}
	}
	return mesh
}
