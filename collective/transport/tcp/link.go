package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
)

// smallFrame is the largest payload copied behind the header into one write;
// past it the copy costs more than a writev of two buffers.
const smallFrame = 32 << 10

// A large frame is written, and a large payload read, with as few system calls
// as the socket allows: each one moves everything that is left (as much as the
// kernel takes). An earlier version moved at most 128 KiB a call, with a yield
// between pieces so that at GOMAXPROCS=1 a rank's receiving goroutine would
// run while its sending twin worked through a frame. Across processes at 64
// MiB that took 1.5-2x as long, and as long again without the yield: the
// loss is the capped calls, while the yield reached only a goroutine already
// runnable, never one parked in the network poller (Go's scheduler polls the
// network only when nothing else is runnable). At these sizes a rank's writes
// complete without blocking (strace: one writev per 256 KiB chunk), so its two
// halves take turns on its core while the peer's core does the peer's copies.

// pollEvery is how many non-blocking system calls a waiting call makes
// between yielding the CPU and checking the clock, the context and Close.
const pollEvery = 2

// errAgain is a raw attempt that found the socket not ready.
var errAgain = errors.New("tcp: would block")

// link is one authenticated connection of a world. It implements transport.Link.
//
// Its I/O goes straight to the socket through syscall.RawConn: an attempt that
// finds nothing to read (or no room to write) polls for a while, yielding the
// CPU in between (see package spin), and only then parks in the network poller
// with the call's deadline. The raw calls run inside RawConn callbacks, which
// hold a reference on the descriptor, so Close cannot release it under them;
// Close sets closed first, which ends the polling within a few attempts.
type link struct {
	// The peer, the I/O timeout, Closed, each direction's first failure
	// (WBroken under wmu: the stream may hold half a frame; RBroken under
	// rmu: the stream position is lost).
	linkutil.Base

	conn     *net.TCPConn
	rc       syscall.RawConn
	job      uint64
	epoch    uint64
	self     uint32
	spinTime time.Duration
	// chunkHint is OversubscribedChunkBytes: oversubscribedChunk, or 0 from a
	// transport whose worlds mix link kinds (Transport.MixedWorlds). Set
	// before the link's first use.
	chunkHint int
	// sec is the link's data-plane setting and chain its secret for
	// moving into a later world (rekey.go); changed only by moveTo, which
	// holds both locks.
	sec   transport.Security
	chain [framesec.ChainSize]byte

	// Send side, guarded by wmu.
	wmu    sync.Mutex
	wbuf   []byte // header + small payload (sealed: with their tags), one write
	whdr   [transport.HeaderSize + framesec.TagSize]byte
	wparts [][]byte // the frame, or the window of it, being written
	wvec   [][]byte // backs wiov, as long as wparts can be
	wiov   [][]byte // what the next write moves: the rest of wparts
	wwake  transport.Waker
	wio    rawIO
	wseal  *framesec.Sealer // nil: plain frames
	wtags  []byte           // authenticated: the tags of a window of segments
	wscr   []byte           // encrypted: a sealed segment (allocated on first use)

	// Receive side, one goroutine at a time; rmu only orders it with Close.
	rmu     sync.Mutex
	rbuf    []byte // read buffer: rbuf[rlo:rhi] is received, not yet consumed
	rlo     int
	rhi     int
	pending int // payload bytes of the last header not read yet
	rwake   transport.Waker
	rio     rawIO
	rdst    []byte    // where the next read lands
	riov    [][]byte  // or, when set, the buffers the next read scatters into
	rvec    [3][]byte // backs riov
	rseal   *framesec.Sealer
	rtag    [framesec.TagSize]byte
	rscr    []byte // encrypted: a sealed segment on its way (allocated on first use)
}

// rawIO is one direction's system calls, made from RawConn callbacks: once is
// one non-blocking attempt; try (a Control callback) repeats it while the
// spin budget lasts, park (a Read or Write callback) asks the poller to wait.
// n and err are the outcome of the last call (err: nil, errAgain, or the
// system call's error).
type rawIO struct {
	spin   spin.Budget
	wait   spin.Wait
	once   func(fd uintptr) (int, error)
	stop   func() bool
	n      int
	err    error
	tryFn  func(fd uintptr)
	parkFn func(fd uintptr) bool
	parkBy func(func(fd uintptr) bool) error // RawConn.Read or RawConn.Write
}

func (d *rawIO) init(b spin.Budget, once func(uintptr) (int, error), stop func() bool, parkBy func(func(uintptr) bool) error) {
	d.spin, d.once, d.stop, d.parkBy = b, once, stop, parkBy
	d.tryFn, d.parkFn = d.try, d.park
}

func (d *rawIO) try(fd uintptr) {
	for {
		n, err := d.once(fd)
		if err == syscall.EAGAIN {
			if d.wait.Again(d.stop) {
				continue
			}
			d.n, d.err = 0, errAgain
			return
		}
		d.n, d.err = n, err
		return
	}
}

func (d *rawIO) park(fd uintptr) bool {
	n, err := d.once(fd)
	if err == syscall.EAGAIN {
		return false
	}
	d.n, d.err = n, err
	return true
}

func newLink(c *net.TCPConn, peer int, addr string, job, epoch uint64, self int, cfg *Config, keys framesec.Keys) *link {
	if addr == "" {
		addr = c.RemoteAddr().String()
	}
	// SyscallConn fails only for a nil connection.
	rc, _ := c.SyscallConn()
	l := &link{
		Base:     linkutil.Base{PeerRank: peer, Addr: addr, IOTimeout: cfg.IOTimeout},
		conn:     c,
		rc:       rc,
		job:      job,
		epoch:    epoch,
		self:     uint32(self),
		spinTime: cfg.SpinTime,
		sec:      keys.Security,
		chain:    keys.Chain,
		wbuf:     make([]byte, framesec.WireSize(keys.Security, smallFrame)),
		rbuf:     make([]byte, cfg.ReadBufferSize),
	}
	l.wparts = make([][]byte, 0, 1+2*sendWindow)
	l.wvec = make([][]byte, 0, 1+2*sendWindow)
	if err := l.initSealing(keys); err != nil {
		// Cannot happen with keys from the handshake; if it does, the link
		// refuses to carry frames rather than carry them unprotected.
		l.WBroken, l.RBroken = err, err
	}
	l.wio.init(spin.NewBudget(cfg.SpinTime, pollEvery, false), l.writeOnce, l.Closed.Load, rc.Write)
	l.rio.init(spin.NewBudget(cfg.SpinTime, pollEvery, false), l.readOnce, l.Closed.Load, rc.Read)
	l.wwake.Init(func(t time.Time) { _ = c.SetWriteDeadline(t) })
	l.rwake.Init(func(t time.Time) { _ = c.SetReadDeadline(t) })
	return l
}

// sameHost reports whether the peer is on this host: a connection between
// two processes of one host has the same address at both ends (loopback or
// not).
func (l *link) sameHost() bool { return sameHostConn(l.conn) }

func sameHostConn(c *net.TCPConn) bool {
	la, lok := c.LocalAddr().(*net.TCPAddr)
	ra, rok := c.RemoteAddr().(*net.TCPAddr)
	return lok && rok && la.IP.Equal(ra.IP)
}

// oversubscribed makes the link's polls, before its first use, also yield to
// other processes: this host's ranks outnumber its CPUs, and the peer may need
// this very CPU.
func (l *link) oversubscribed() {
	l.wio.spin = spin.NewBudget(l.spinTime, pollEvery, true)
	l.rio.spin = spin.NewBudget(l.spinTime, pollEvery, true)
}

// oversubscribedChunk is the collectives' chunk a link suggests when this
// host's ranks outnumber its CPUs. Small chunks pay off by overlapping one
// rank's copies and reductions with its neighbours' on other cores; with
// ranks two to a core every core is busy anyway, so small chunks only add
// frames, each a hand-off between ranks that wait for each other. Measured,
// 4 ranks on 2 cores, 4 MiB allreduce over loopback TCP, on a machine
// loaded by other jobs: 1 MiB chunks made 20-30 % fewer context switches
// and used up to a fifth less CPU than 256 KiB ones, and in four
// interleaved runs the median time was 1.06-1.45x as fast at 4 and 16 MiB
// (docs/performance.md). The polling was not the cost: a build that
// counted its waits spent 1-2 % of a rank's time polling (its yields paused
// by slow ones most of the run), and not polling at all measured within the
// noise.
const oversubscribedChunk = 1 << 20

// OversubscribedChunkBytes is the chunk this link suggests for a world whose
// ranks on this host outnumber its CPUs (transport.ChunkHinter).
func (l *link) OversubscribedChunkBytes() int { return l.chunkHint }

// setBuffers sets the connected socket's SO_RCVBUF and SO_SNDBUF to n bytes,
// before the link's first use. The window scale, agreed at connect time from
// the autotuning maximum, covers them.
func (l *link) setBuffers(n int) error {
	var serr error
	if err := l.rc.Control(func(fd uintptr) { serr = setSocketBuffers(int(fd), n) }); err != nil {
		return err
	}
	return serr
}

// Close tears the connection down; blocked calls wake with ErrLinkClosed.
func (l *link) Close() error {
	if l.Closed.Swap(true) {
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

// ioCall is the state of one blocking call: its context, and whether the
// context's deadline (rather than the I/O timeout) is the one set on the
// connection for the current park.
type ioCall struct {
	ctx      context.Context
	ctxBound bool
}

// park prepares a call to sleep in the network poller: it watches the call's
// context and sets the direction's deadline to the earlier of IOTimeout of
// silence from now and the context's deadline. It fails, before sleeping, if
// the context has ended: checking after the deadline is set catches a context
// whose watch fired just before and whose past deadline the new one would
// otherwise have undone.
func (l *link) park(w *transport.Waker, c *ioCall) error {
	w.Watch(c.ctx)
	var dl time.Time
	dl, c.ctxBound = l.Deadline(c.ctx)
	w.SetDeadline(dl)
	return l.Interrupted(c.ctx)
}

// classify maps an I/O error to the transport's sentinel errors.
func (l *link) classify(c *ioCall, err error) error {
	if l.Closed.Load() {
		return transport.ErrLinkClosed
	}
	var fe *transport.FrameError
	if errors.As(err, &fe) {
		return err
	}
	if err == context.Canceled || err == context.DeadlineExceeded {
		return err
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return linkutil.Expired(c.ctx, c.ctxBound)
	}
	if cerr := c.ctx.Err(); cerr != nil && errors.Is(err, net.ErrClosed) {
		return cerr
	}
	// Anything but a clean close is a host unreachable, a keepalive timeout.
	peerClosed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, net.ErrClosed)
	return l.Failure(err, peerClosed, "connection")
}

// ---- sending ----

// Send writes one frame: a small one in one system call, a large one with
// writev of the header and the payload. The header is encoded from a copy, so
// the caller's h is left as it was.
func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.SendReady(ctx, h, payload); err != nil {
		return err
	}
	hh := *h
	return l.send(ctx, &hh, payload)
}

// sendStripe writes one lane's part of a frame striped over a link's
// lanes (see lanedLink): on the first lane the frame's header hh, whose
// Length is the whole payload's, then the first stripe; on another lane
// (hh nil) its stripe alone. A stripe goes out sealed like a payload of
// its length, with this lane's keys and counters.
func (l *link) sendStripe(ctx context.Context, hh *transport.Header, stripe []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.SendOpen(ctx); err != nil {
		return err
	}
	return l.send(ctx, hh, stripe)
}

// send writes the header hh, stamped with this link's job, world and rank
// (nil: no header, a further lane's stripe), then payload, for Send and
// sendStripe, which hold wmu and have made their checks. A failure that
// may have left part of a frame in the stream breaks the sending side.
func (l *link) send(ctx context.Context, hh *transport.Header, payload []byte) error {
	c := ioCall{ctx: ctx}
	if hh != nil {
		hh.JobID, hh.Epoch, hh.Sender = l.job, l.epoch, l.self
	}
	var err error
	switch {
	case l.wseal != nil:
		err = l.sendSealed(&c, hh, payload)
	case hh != nil && len(payload) <= smallFrame:
		buf := l.wbuf[:transport.HeaderSize+len(payload)]
		hh.Encode(buf)
		copy(buf[transport.HeaderSize:], payload)
		l.wparts = append(l.wparts[:0], buf)
		err = l.writeFrame(&c)
	default:
		l.wparts = l.wparts[:0]
		if hh != nil {
			hh.Encode(l.whdr[:])
			l.wparts = append(l.wparts, l.whdr[:transport.HeaderSize])
		}
		l.wparts = append(l.wparts, payload)
		err = l.writeFrame(&c)
	}
	l.dropSendRefs()
	if err != nil {
		return l.SendFailed(l.classify(&c, err))
	}
	return nil
}

// dropSendRefs drops the references to the frame just written, so the link
// does not pin the caller's buffer.
func (l *link) dropSendRefs() {
	clear(l.wparts[:cap(l.wparts)])
	clear(l.wvec[:cap(l.wvec)])
	l.wparts, l.wiov = l.wparts[:0], nil
}

// writeFrame writes l.wparts, each system call all that is left of them.
func (l *link) writeFrame(c *ioCall) error {
	done, total := 0, 0 // bytes written, bytes to write
	for _, p := range l.wparts {
		total += len(p)
	}
	for done < total {
		l.frameRest(done)
		n, err := l.write(c)
		done += n
		if err != nil {
			return err
		}
	}
	return nil
}

// frameRest points l.wiov at what is left of l.wparts from byte done on.
func (l *link) frameRest(done int) {
	l.wiov = l.wvec[:0]
	for _, p := range l.wparts {
		if done >= len(p) {
			done -= len(p)
			continue
		}
		l.wiov = append(l.wiov, p[done:])
		done = 0
	}
}

// write makes one write of l.wiov: polling while the socket has no room, then
// parking. It returns the bytes written (at least one unless it fails).
func (l *link) write(c *ioCall) (int, error) { return l.do(&l.wio, &l.wwake, c) }

// do makes one system call's worth of I/O in direction d: polling while the
// socket is not ready, then parking with the call's deadline.
func (l *link) do(d *rawIO, w *transport.Waker, c *ioCall) (int, error) {
	d.wait = d.spin.BeginContext(c.ctx)
	if err := l.rc.Control(d.tryFn); err != nil {
		return 0, err
	}
	if d.err != errAgain {
		d.wait.End(true)
		return d.n, d.err
	}
	d.wait.End(false)
	if err := l.park(w, c); err != nil {
		return 0, err
	}
	if err := d.parkBy(d.parkFn); err != nil {
		return 0, err
	}
	return d.n, d.err
}

func (l *link) writeOnce(fd uintptr) (int, error) {
	for {
		var n int
		var err error
		if len(l.wiov) == 1 {
			n, err = unix.Write(int(fd), l.wiov[0])
		} else {
			n, err = unix.Writev(int(fd), l.wiov)
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, nil
	}
}

// ---- receiving ----

// RecvHeader reads and checks the next frame header.
func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	// A frame boundary is where this process's sending goroutine gets its
	// turn: at GOMAXPROCS=1 a receiver that always finds its next frame
	// waiting would otherwise keep the only P and starve the sender, whose
	// frames the peer is waiting for. Without another runnable goroutine this
	// costs a few hundred nanoseconds.
	spin.YieldGoroutines(ctx) // not on a locked thread (spin.OnLockedThread)
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.HeaderReady(ctx, l.pending); err != nil {
		return err
	}
	c := ioCall{ctx: ctx}
	// Nothing is consumed until the whole header is buffered (HeaderFailed).
	if err := l.readHeader(&c, h); err != nil {
		return l.HeaderFailed(l.classify(&c, err))
	}
	l.pending = int(h.Length)
	return nil
}

func (l *link) readHeader(c *ioCall, h *transport.Header) error {
	n := transport.HeaderSize
	if l.rseal != nil {
		n += framesec.TagSize
	}
	if err := l.fill(c, n); err != nil {
		return err
	}
	b := l.rbuf[l.rlo : l.rlo+n]
	if l.rseal != nil {
		// Verified (and decrypted) in place before anything of it is used.
		if _, err := l.rseal.OpenInPlace(b); err != nil {
			return err
		}
	}
	if err := transport.DecodeFrom(b[:transport.HeaderSize], h, l.job, l.epoch, l.PeerRank); err != nil {
		return err
	}
	l.rlo += n
	return nil
}

// fill reads until at least n bytes (n ≤ len(rbuf)) are buffered.
func (l *link) fill(c *ioCall, n int) error {
	if l.rhi-l.rlo >= n {
		return nil
	}
	if len(l.rbuf)-l.rlo < n {
		l.rhi = copy(l.rbuf, l.rbuf[l.rlo:l.rhi])
		l.rlo = 0
	}
	for l.rhi-l.rlo < n {
		m, err := l.read(c, l.rbuf[l.rhi:])
		l.rhi += m
		if err != nil {
			return err
		}
	}
	return nil
}

// RecvPayload reads the payload announced by the last header into p. What is
// buffered already is copied; the rest of a large payload is read straight into
// p, so it lands there with one copy.
func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if done, err := l.PayloadReady(ctx, len(p), l.pending); done || err != nil {
		return err
	}
	return l.readInto(ctx, p)
}

// recvStripe reads one lane's part of a payload striped over a link's
// lanes (see lanedLink) straight into p: on the first lane the first
// stripe of the payload whose header was just received (the lanes' owner
// has checked the whole payload's length), on another lane its stripe,
// which comes without a header.
func (l *link) recvStripe(ctx context.Context, p []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.RecvReady(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		l.RBroken = err
		return l.PeerErr("recv", err)
	}
	return l.readInto(ctx, p)
}

// readInto reads len(p) payload bytes into p (verifying them on a sealed
// link) for RecvPayload and recvStripe, which hold rmu.
func (l *link) readInto(ctx context.Context, p []byte) error {
	c := ioCall{ctx: ctx}
	var err error
	if l.rseal != nil {
		err = l.readPayloadSealed(&c, p)
	} else {
		err = l.readPayload(&c, p)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return l.RecvFailed(l.classify(&c, err))
	}
	l.pending = 0
	return nil
}

func (l *link) readPayload(c *ioCall, p []byte) error {
	n := copy(p, l.rbuf[l.rlo:l.rhi])
	l.rlo += n
	for n < len(p) {
		rest := len(p) - n
		if rest < len(l.rbuf) {
			// The tail: read it through the buffer, which then also catches
			// what follows (the next header, often), saving a system call.
			if err := l.fill(c, rest); err != nil {
				return err
			}
			l.rlo += copy(p[n:], l.rbuf[l.rlo:l.rlo+rest])
			return nil
		}
		m, err := l.read(c, p[n:])
		n += m
		if err != nil {
			return err
		}
	}
	return nil
}

// read makes one read into dst: polling while nothing has arrived, then
// parking. It returns the bytes read (at least one unless it fails; io.EOF
// when the peer has closed).
func (l *link) read(c *ioCall, dst []byte) (int, error) {
	l.rdst = dst
	defer func() { l.rdst = nil }()
	return l.do(&l.rio, &l.rwake, c)
}

func (l *link) readOnce(fd uintptr) (int, error) {
	for {
		var n int
		var err error
		if l.riov != nil {
			n, err = unix.Readv(int(fd), l.riov)
		} else {
			n, err = unix.Read(int(fd), l.rdst)
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}
