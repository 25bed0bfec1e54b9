package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/linkutil"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
)

// pieceBytes is the most a Send copies into the ring (or a Recv out of it)
// before publishing its counter, so that the other side can start on a large
// frame while the rest of it is still being copied, and so that a copy never
// takes the non-temporal path memmove uses for very large blocks (the peer is
// about to read these bytes from the cache).
const pieceBytes = 64 << 10

// spinCheck is how many polls pass between checks of the clock, the link's
// state and the context while spinning, and between yields to the other
// goroutines of the process.
const spinCheck = 64

// link is one rank pair's shared-memory connection. It implements transport.Link.
type link struct {
	// The peer, the I/O timeout, Closed, each direction's first failure
	// (WBroken under wmu: a failure after part of a frame was published;
	// RBroken under rmu).
	linkutil.Base

	job, epoch uint64
	self       uint32

	reg        *region
	out, in    ring    // out: this side produces; in: this side consumes
	selfClosed *uint32 // this side's closed flag in the region
	peerClosed *uint32 // the peer's

	peerGone atomic.Bool // a FIFO read saw end-of-file: the peer's write ends are closed
	stopFn   func() bool // closed or peer gone: a polling wait ends

	// How long a wait of each direction polls before it parks.
	spinTime     time.Duration
	wspin, rspin spin.Budget

	// Send side, guarded by wmu.
	wmu    sync.Mutex
	wtail  uint64 // bytes written into out, published or not
	wpub   uint64 // bytes published (out.tail)
	whead  uint64 // out.head as last read
	spaceR *os.File
	dataW  int // the peer's receive FIFO
	wwake  transport.Waker
	wdrain [64]byte
	one    [1]byte

	// Receive side, one goroutine at a time; rmu orders it with Close.
	rmu     sync.Mutex
	rhead   uint64 // bytes consumed from in
	rpub    uint64 // bytes released to the producer (in.head)
	rtail   uint64 // in.tail as last read
	rskip   uint64 // padding after the last frame's payload, skipped before the next header
	pending int    // payload bytes of the last header not read yet
	dataR   *os.File
	spaceW  int // the peer's send FIFO
	rwake   transport.Waker
	rdrain  [64]byte
	rone    [1]byte

	// Single copy: payloads of at least singleMin bytes (0: never) are not
	// copied into the ring; the receiver reads them straight out of this
	// process's memory (process_vm_readv) while Send waits for its ack.
	singleMin int
	peerPID   int
	wseq      uint64 // last single-copy record sent (wmu)
	rseq      uint64 // last single-copy record received (rmu)
	rsingle   bool   // the pending payload is a single-copy one at raddr
	raddr     uint64
	liov      [1]unix.Iovec
	riov      [1]unix.RemoteIovec
}

// endpoint is what a setup hands to newLink: the mapped region and this side's
// FIFO ends.
type endpoint struct {
	reg           *region
	side          int      // 0: the lower rank of the pair, 1: the higher
	dataR, spaceR *os.File // this side's FIFOs, read ends
	dataW, spaceW int      // the peer's FIFOs, write ends
	peer          int
	addr          string
	job, epoch    uint64
	self          int
	ioTimeout     time.Duration
	spin          time.Duration
	singleMin     int // 0: the peer cannot read this process's memory
	peerPID       int
}

func newLink(e *endpoint) *link {
	l := &link{
		Base:       linkutil.Base{PeerRank: e.peer, Addr: e.addr, IOTimeout: e.ioTimeout},
		job:        e.job,
		epoch:      e.epoch,
		self:       uint32(e.self),
		spinTime:   e.spin,
		wspin:      spin.NewBudget(e.spin, spinCheck, false),
		rspin:      spin.NewBudget(e.spin, spinCheck, false),
		reg:        e.reg,
		out:        e.reg.ring(e.side),
		in:         e.reg.ring(1 - e.side),
		selfClosed: e.reg.closedFlag(e.side),
		peerClosed: e.reg.closedFlag(1 - e.side),
		spaceR:     e.spaceR,
		dataW:      e.dataW,
		dataR:      e.dataR,
		spaceW:     e.spaceW,
		singleMin:  e.singleMin,
		peerPID:    e.peerPID,
	}
	l.stopFn = func() bool { return l.Closed.Load() || l.gone() }
	spaceR, dataR := e.spaceR, e.dataR
	l.wwake.Init(func(t time.Time) { _ = spaceR.SetReadDeadline(t) })
	l.rwake.Init(func(t time.Time) { _ = dataR.SetReadDeadline(t) })
	return l
}

// oversubscribed adapts the link, before its first use, to a host whose
// ranks outnumber its CPUs, so that they take turns on the cores: frames go
// through the ring (a single-copy Send would wait for a receiver that is
// often not running) and polls yield to other processes (the peer may need
// this very CPU), which lets a wait poll longer (spin.NewYieldingBudget):
// the rank it waits for often shares this core and runs as soon as it
// yields, where a parked wait would add a wake-up through the FIFO.
func (l *link) oversubscribed() {
	l.singleMin = 0
	l.wspin = spin.NewYieldingBudget(l.spinTime, spinCheck)
	l.rspin = spin.NewYieldingBudget(l.spinTime, spinCheck)
}

// Close tears the link down. Blocked calls wake with ErrLinkClosed; the peer's
// wake with ErrPeerClosed once they have taken every complete frame still in
// the ring.
func (l *link) Close() error {
	if l.Closed.Swap(true) {
		return nil
	}
	atomic.StoreUint32(l.selfClosed, 1)
	// A deadline in the past wakes a parked call of ours at once.
	_ = l.spaceR.SetReadDeadline(time.Unix(1, 0))
	_ = l.dataR.SetReadDeadline(time.Unix(1, 0))
	// Once the calls in flight have returned (they hold the locks), nothing
	// touches the FIFOs or the mapping again: every call checks closed first.
	// Closing the peer's write ends wakes the peer's parked calls with
	// end-of-file.
	l.wmu.Lock()
	l.wwake.Release()
	_ = unix.Close(l.dataW)
	_ = l.spaceR.Close()
	l.wmu.Unlock()
	l.rmu.Lock()
	l.rwake.Release()
	_ = unix.Close(l.spaceW)
	_ = l.dataR.Close()
	l.reg.unmap()
	l.rmu.Unlock()
	return nil
}

// gone reports whether the peer closed its side or died.
func (l *link) gone() bool {
	return l.peerGone.Load() || atomic.LoadUint32(l.peerClosed) != 0
}

func corrupt(peer int, what string) error {
	return &transport.FrameError{Peer: peer, Reason: "shared-memory ring corrupted: " + what}
}

// broken is a FIFO or process_vm_readv failure other than the expected ones.
func broken(err error) error {
	return &linkutil.BrokenError{What: "shared-memory link", Err: err}
}

// waitSide is what a wait needs of one direction: the FIFO this side parks
// on, the flag in the region that asks the peer to wake it, the context watch
// and a buffer to drain wake bytes into.
type waitSide struct {
	f     *os.File
	flag  *uint32
	wake  *transport.Waker
	spin  *spin.Budget
	drain []byte
}

// wait returns once cond holds, or with an error: the link closed, the peer
// gone, ctx ended, or IOTimeout of silence. It polls first: for up to
// Config.SpinTime (adapted per direction, see package spin) it re-reads the
// counters, letting the process's other goroutines run (Gosched) and, when
// other processes want this CPU (more ranks than cores), letting them run too
// (sched_yield): the peer often needs exactly this core to make the progress
// being waited for. Then it raises the flag and
// parks on the FIFO until the peer, having seen the flag, writes a wake byte.
// When the peer is gone, cond is still asked once more first, so what the peer
// published before going is not lost.
func (l *link) wait(ctx context.Context, ws *waitSide, cond func() (bool, error)) error {
	w := ws.spin.BeginContext(ctx)
	for {
		if ok, err := cond(); ok || err != nil {
			w.End(ok)
			return err
		}
		if !w.Again(l.stopFn) {
			break
		}
	}
	w.End(false)
	dl, ctxBound := l.Deadline(ctx)
	ws.wake.Watch(ctx)
	for {
		if l.Closed.Load() {
			return transport.ErrLinkClosed
		}
		atomic.StoreUint32(ws.flag, 1)
		// Read the peer's state before the counters: what it published before
		// closing is then seen.
		gone := l.gone()
		ok, err := cond()
		if ok || err != nil {
			atomic.StoreUint32(ws.flag, 0)
			return err
		}
		if gone {
			atomic.StoreUint32(ws.flag, 0)
			return transport.ErrPeerClosed
		}
		if err := l.park(ws, ctx, dl, ctxBound); err != nil {
			atomic.StoreUint32(ws.flag, 0)
			if linkutil.IsWait(err) {
				// Progress that came just as the wait ended is taken after all.
				if ok, _ := cond(); ok {
					return nil
				}
			}
			return err
		}
	}
}

// park blocks on the FIFO until the peer writes a wake byte, the deadline
// passes, ctx ends, the link closes or the peer's write end closes. It returns
// nil when the caller should look at the ring again.
func (l *link) park(ws *waitSide, ctx context.Context, dl time.Time, ctxBound bool) error {
	_ = ws.f.SetReadDeadline(dl)
	if err := l.Interrupted(ctx); err != nil {
		return err
	}
	_, err := ws.f.Read(ws.drain)
	if err == nil {
		return nil
	}
	switch {
	case l.Closed.Load():
		return transport.ErrLinkClosed
	case errors.Is(err, io.EOF):
		l.peerGone.Store(true)
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if !time.Now().Before(dl) {
			return linkutil.Expired(ctx, ctxBound)
		}
		return nil
	case errors.Is(err, os.ErrClosed):
		return transport.ErrLinkClosed
	}
	return broken(err)
}

// ---- sending ----

// Send puts one frame into the ring. An inline frame is copied into the ring
// and Send returns without waiting for the peer (frames up to RingBytes never
// wait for it); a single-copy frame (a payload of at least singleMin bytes,
// when the peer can read this process's memory) waits until the peer has
// copied it. The header is encoded from a copy; the caller's h is left as it was.
func (l *link) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	return l.send(ctx, h, payload, true)
}

// SendInPlace sends the frame through the ring, whatever its size, so that
// the receiver can consume it in place (transport.InPlaceLink). It returns as
// soon as the frame is in the ring.
func (l *link) SendInPlace(ctx context.Context, h *transport.Header, payload []byte) error {
	return l.send(ctx, h, payload, false)
}

// send is Send; singleOK allows a single-copy frame.
func (l *link) send(ctx context.Context, h *transport.Header, payload []byte, singleOK bool) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.SendReady(ctx, h, payload); err != nil {
		return err
	}
	if l.gone() {
		return l.PeerErr("send", transport.ErrPeerClosed)
	}
	single := singleOK && l.singleMin > 0 && len(payload) >= l.singleMin
	var rec [recordAlign]byte
	hh := *h
	hh.JobID, hh.Epoch, hh.Sender = l.job, l.epoch, l.self
	hh.Encode(rec[:])
	start := l.wtail
	var err error
	if single {
		rec[offKind] = recSingle
		binary.LittleEndian.PutUint64(rec[offAddr:], uint64(uintptr(unsafe.Pointer(unsafe.SliceData(payload)))))
		binary.LittleEndian.PutUint64(rec[offSeq:], l.wseq+1)
		err = l.put(ctx, rec[:], len(rec))
	} else {
		err = l.put(ctx, rec[:], len(rec))
		if err == nil {
			err = l.put(ctx, payload, len(payload))
		}
		if err == nil {
			err = l.put(ctx, nil, padding(len(payload)))
		}
	}
	if err == nil {
		l.publishTail()
		if !single {
			return nil
		}
		l.wseq++
		err = l.waitAcked(ctx)
		// The payload must stay alive and unchanged until the peer has read it.
		runtime.KeepAlive(payload)
		if err == nil {
			return nil
		}
		// Whatever the peer copies from now on may already be overwritten by
		// the caller: withdraw the frame, so the peer rejects it unless it
		// finished copying before this point.
		atomic.StoreUint64(l.out.withdrawn, l.wseq)
	} else if l.wpub == start && err != transport.ErrLinkClosed {
		// Nothing of the frame was published: forget it, the stream is intact.
		l.wtail = start
		return l.PeerErr("send", err)
	}
	return l.SendFailed(err)
}

// padding is the filler after a payload of n bytes, up to the next record boundary.
func padding(n int) int { return (recordAlign - n%recordAlign) % recordAlign }

// put writes src into the ring, or, with src nil, skips n bytes of padding.
func (l *link) put(ctx context.Context, src []byte, n int) error {
	for n > 0 {
		free := l.out.size - (l.wtail - l.whead)
		if free == 0 {
			if err := l.waitSpace(ctx); err != nil {
				return err
			}
			continue
		}
		idx := l.wtail & l.out.mask
		k := min(free, uint64(n), l.out.size-idx, pieceBytes)
		if src != nil {
			copy(l.out.data[idx:idx+k], src[:k])
			src = src[k:]
		}
		n -= int(k)
		l.wtail += k
		if l.wtail-l.wpub >= pieceBytes {
			if l.Closed.Load() {
				return transport.ErrLinkClosed
			}
			l.publishTail()
		}
	}
	return nil
}

// publishTail makes the bytes written so far visible and wakes the peer's
// receiver if it is parked. The flag is cleared by whoever wakes the receiver,
// so one parked wait costs one wake.
func (l *link) publishTail() {
	raceRelease()
	atomic.StoreUint64(l.out.tail, l.wtail)
	l.wpub = l.wtail
	if atomic.LoadUint32(l.out.dataWaiting) != 0 && atomic.CompareAndSwapUint32(l.out.dataWaiting, 1, 0) {
		// The FIFO is non-blocking: when it is full, wakes are pending anyway.
		_, _ = unix.Write(l.dataW, l.one[:])
	}
}

// haveSpace reads the consumer's counter and reports whether the ring has room.
func (l *link) haveSpace() (bool, error) {
	h := atomic.LoadUint64(l.out.head)
	raceAcquire()
	if l.wtail-h > l.out.size || h-l.whead > l.out.size {
		return false, corrupt(l.PeerRank, fmt.Sprintf("consumer counter %d outside [%d, %d]", h, l.whead, l.wtail))
	}
	l.whead = h
	return l.wtail-h < l.out.size, nil
}

func (l *link) sendSide() *waitSide {
	return &waitSide{f: l.spaceR, flag: l.out.spaceWaiting, wake: &l.wwake, spin: &l.wspin, drain: l.wdrain[:]}
}

// waitSpace waits until the ring has room.
func (l *link) waitSpace(ctx context.Context) error {
	if ok, err := l.haveSpace(); ok || err != nil {
		return err
	}
	// The consumer can only free space it can see.
	l.publishTail()
	return l.wait(ctx, l.sendSide(), l.haveSpace)
}

// waitAcked waits until the peer has copied the last single-copy payload.
func (l *link) waitAcked(ctx context.Context) error {
	acked := func() (bool, error) {
		a := atomic.LoadUint64(l.out.acked)
		raceAcquire()
		if a > l.wseq || a+1 < l.wseq {
			return false, corrupt(l.PeerRank, fmt.Sprintf("single-copy ack %d, last sent %d", a, l.wseq))
		}
		return a == l.wseq, nil
	}
	return l.wait(ctx, l.sendSide(), acked)
}

// ---- receiving ----

// RecvHeader reads and checks the next frame header.
func (l *link) RecvHeader(ctx context.Context, h *transport.Header) error {
	// A frame boundary is where this process's sending goroutine gets its
	// turn: at GOMAXPROCS=1 a receiver that always finds its next frame
	// waiting would otherwise keep the only P (Go preempts after 10ms) and
	// starve the sender, whose frames the peer is waiting for; the two ranks
	// would then take turns instead of overlapping. Without another runnable
	// goroutine this costs a few hundred nanoseconds.
	spin.YieldGoroutines(ctx) // not on a locked thread (spin.OnLockedThread)
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if err := l.HeaderReady(ctx, l.pending); err != nil {
		return err
	}
	// Nothing is consumed until the whole record head is there
	// (HeaderFailed).
	need := l.rskip + recordAlign
	if err := l.waitData(ctx, need); err != nil {
		return l.HeaderFailed(err)
	}
	at := (l.rhead + l.rskip) & l.in.mask
	rec := l.in.data[at : at+recordAlign]
	kind := rec[offKind]
	if kind != recInline && kind != recSingle {
		l.RBroken = corrupt(l.PeerRank, fmt.Sprintf("record kind %d", kind))
		return l.PeerErr("recv", l.RBroken)
	}
	if err := transport.DecodeFrom(rec, h, l.job, l.epoch, l.PeerRank); err != nil {
		l.RBroken = err
		return l.PeerErr("recv", err)
	}
	l.rsingle = kind == recSingle
	if l.rsingle {
		addr, seq := binary.LittleEndian.Uint64(rec[offAddr:]), binary.LittleEndian.Uint64(rec[offSeq:])
		if seq != l.rseq+1 || h.Length == 0 {
			l.RBroken = corrupt(l.PeerRank, fmt.Sprintf("single-copy record %d of %d bytes after record %d", seq, h.Length, l.rseq))
			return l.PeerErr("recv", l.RBroken)
		}
		l.raddr = addr
	}
	l.rhead += need
	l.rskip = 0
	if !l.rsingle {
		l.rskip = uint64(padding(int(h.Length)))
	}
	l.pending = int(h.Length)
	if l.pending == 0 || l.rsingle {
		l.publishHead()
	}
	return nil
}

// RecvPayload copies the payload announced by the last header into p: out of
// the ring, releasing ring space as it goes, or straight out of the peer's
// memory for a single-copy frame.
func (l *link) RecvPayload(ctx context.Context, p []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if done, err := l.payloadStart(ctx, p); done || err != nil {
		return err
	}
	return l.fromRing(ctx, len(p), p, nil)
}

// payloadStart begins receiving the payload announced by the last header into
// p: it checks the link, p's length and ctx, and copies a single-copy payload
// whole. done says that nothing is left to read (an empty or single-copy
// payload).
func (l *link) payloadStart(ctx context.Context, p []byte) (done bool, err error) {
	if done, err := l.PayloadReady(ctx, len(p), l.pending); done || err != nil {
		return done, err
	}
	if !l.rsingle {
		return false, nil
	}
	if err := l.readSingle(p); err != nil {
		return false, l.RecvFailed(err)
	}
	l.pending = 0
	return true, nil
}

// RecvPayloadInPlace hands the payload announced by the last header to fn
// where it lies (transport.InPlaceLink): piece by piece out of the ring,
// releasing ring space as fn returns; a single-copy payload is first copied
// out of the peer's memory into scratch.
func (l *link) RecvPayloadInPlace(ctx context.Context, scratch []byte, fn func(off int, piece []byte) error) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	single := l.rsingle
	if done, err := l.payloadStart(ctx, scratch); err != nil || (done && !single) {
		return err
	}
	if single {
		if err := fn(0, scratch); err != nil {
			l.RBroken = fmt.Errorf("the frame's consumer failed: %w", err)
			return err
		}
		return nil
	}
	return l.fromRing(ctx, len(scratch), nil, fn)
}

// fromRing takes the n payload bytes of the current frame out of the ring:
// copied into dst, or, with dst nil, handed to fn piece by piece where they
// lie. Ring space is released as the bytes are taken.
func (l *link) fromRing(ctx context.Context, n int, dst []byte, fn func(off int, piece []byte) error) error {
	for off := 0; off < n; {
		// Pieces but the last are multiples of 64 bytes: wait for that much.
		want := uint64(min(inPlaceAlign, n-off))
		if l.rtail-l.rhead < want {
			if err := l.waitData(ctx, want); err != nil {
				return l.RecvFailed(err)
			}
		}
		idx := l.rhead & l.in.mask
		k := min(l.rtail-l.rhead, uint64(n-off), l.in.size-idx, pieceBytes)
		if int(k) < n-off {
			k &^= inPlaceAlign - 1
		}
		piece := l.in.data[idx : idx+k : idx+k]
		if dst != nil {
			copy(dst[off:], piece)
		} else if err := fn(off, piece); err != nil {
			l.RBroken = fmt.Errorf("the frame's consumer failed: %w", err)
			return err
		}
		off += int(k)
		l.rhead += k
		if l.rhead-l.rpub >= pieceBytes {
			l.publishHead()
		}
	}
	l.pending = 0
	l.publishHead()
	return nil
}

// inPlaceAlign is what every piece of RecvPayloadInPlace but the last is a
// multiple of.
const inPlaceAlign = 64

// singleChunk bounds one process_vm_readv, so Close is noticed between chunks.
const singleChunk = 4 << 20

// readSingle copies a single-copy payload out of the peer's memory, then acks
// it, unless the peer withdrew it meanwhile (its Send gave up, so the memory
// may already hold something else).
func (l *link) readSingle(p []byte) error {
	seq := l.rseq + 1
	defer func() { l.liov[0].Base = nil }() // do not pin the caller's buffer
	for off := 0; off < len(p); {
		if l.Closed.Load() {
			return transport.ErrLinkClosed
		}
		k := min(len(p)-off, singleChunk)
		l.liov[0] = unix.Iovec{Base: &p[off]}
		l.liov[0].SetLen(k)
		l.riov[0] = unix.RemoteIovec{Base: uintptr(l.raddr) + uintptr(off), Len: k}
		n, err := unix.ProcessVMReadv(l.peerPID, l.liov[:], l.riov[:], 0)
		switch {
		case errors.Is(err, unix.ESRCH):
			return transport.ErrPeerClosed
		case err != nil:
			return broken(fmt.Errorf("reading the peer's payload: %w", err))
		case n <= 0:
			return broken(errors.New("reading the peer's payload: no progress"))
		}
		off += n
	}
	if atomic.LoadUint64(l.in.withdrawn) >= seq {
		return broken(errors.New("the peer withdrew the frame it was sending"))
	}
	l.rseq = seq
	raceRelease()
	atomic.StoreUint64(l.in.acked, seq)
	l.wakeProducer()
	return nil
}

// publishHead releases the consumed bytes and wakes the peer's sender if it is
// parked waiting for room.
func (l *link) publishHead() {
	if l.rhead == l.rpub {
		return
	}
	raceRelease()
	atomic.StoreUint64(l.in.head, l.rhead)
	l.rpub = l.rhead
	l.wakeProducer()
}

func (l *link) wakeProducer() {
	if atomic.LoadUint32(l.in.spaceWaiting) != 0 && atomic.CompareAndSwapUint32(l.in.spaceWaiting, 1, 0) {
		_, _ = unix.Write(l.spaceW, l.rone[:])
	}
}

// haveData reads the producer's counter and reports whether need bytes are there.
func (l *link) haveData(need uint64) (bool, error) {
	t := atomic.LoadUint64(l.in.tail)
	raceAcquire()
	if t-l.rhead > l.in.size {
		return false, corrupt(l.PeerRank, fmt.Sprintf("producer counter %d outside [%d, %d]", t, l.rhead, l.rhead+l.in.size))
	}
	l.rtail = t
	return t-l.rhead >= need, nil
}

// waitData waits until need bytes are in the ring.
func (l *link) waitData(ctx context.Context, need uint64) error {
	if l.rtail-l.rhead >= need {
		return nil
	}
	if ok, err := l.haveData(need); ok || err != nil {
		return err
	}
	// The producer may be waiting for the room this side has freed.
	l.publishHead()
	ws := waitSide{f: l.dataR, flag: l.in.dataWaiting, wake: &l.rwake, spin: &l.rspin, drain: l.rdrain[:]}
	return l.wait(ctx, &ws, func() (bool, error) { return l.haveData(need) })
}
