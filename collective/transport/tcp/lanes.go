package tcp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// stripeMin is the smallest stripe a lane carries: a data frame is striped
// over as many lanes as it has stripeMin bytes for (at most the link's
// lanes), so frames under twice this go whole on the first lane, where a
// hand-off to another lane's goroutine would cost more than it saves.
const stripeMin = 32 << 10

// stripes is how many lanes a data frame of n payload bytes goes over when
// lanes lanes carry the link's data; both ends compute it from the header
// and the count the sender last announced.
func stripes(n, lanes int) int { return min(lanes, n/stripeMin) }

// stripe is stripe k of m of p: contiguous, each but the last the same
// length, a multiple of 64 bytes.
func stripe(p []byte, k, m int) []byte {
	q := (len(p) / m) &^ 63
	if k == m-1 {
		return p[k*q:]
	}
	return p[k*q : (k+1)*q]
}

// lanedLink is a link to one peer over several TCP connections (lanes,
// Config.Lanes). Frames and their order live on the first lane: small
// frames travel there whole, as on a one-lane link. A data frame of at
// least 2*stripeMin bytes is cut into contiguous stripes, one per lane:
// the first goes behind the header on the first lane, each other one
// alone on its lane, written by that lane's own goroutine straight from
// the caller's buffer and read by that lane's own goroutine straight into
// the receiver's, while the calling goroutine serves the first lane. Both
// ends cut the same way from the header's length, so stripes carry no
// header of their own. Each lane is a link of its own underneath, with
// its own keys and counters when frames are sealed, so every stripe is
// verified on the lane it came by.
//
// How many of the lanes carry data frames is each sender's choice, made
// per direction: all of them when Config.Lanes set the count, else
// measured (laneChooser, autolanes.go). A sender announces a new count
// with a FrameLanes frame on the first lane before the first data frame
// that uses it; the receiver consumes it in RecvHeader.
//
// A failure of any lane while a striped frame is under way breaks the
// whole link: later calls fail with it, and unless the caller's context
// caused it the lanes are closed, so the others stop waiting at once.
type lanedLink struct {
	lanes  []*link
	sendTo []laneWorker // sendTo[k] writes lane k's stripes (k ≥ 1)
	recvOn []laneWorker // recvOn[k] reads lane k's stripes (k ≥ 1)
	quit   chan struct{}
	closed atomic.Bool
	// broken is the failure of a striped frame that left the lanes out of
	// step: every later call fails with it.
	broken atomic.Pointer[error]

	// Send side, under smu, which orders the frames that may be striped,
	// each whole: the lanes the peer was last told carry them (at first
	// all), and when auto, the chooser of the count; settled reports the
	// chosen count, and the rate measured at each count tried (bytes per
	// second, by count), once.
	smu     sync.Mutex
	sactive int
	auto    bool
	chooser laneChooser
	settled func(lanes int, rates []float64)
	// While the chooser measures (probing), the bytes of the frames sent
	// whole outside smu, which its measurement of the first lane's queue
	// must count too.
	probing   atomic.Bool
	unmetered atomic.Int64
	outq      []int              // each lane's unacknowledged bytes, as last read
	outqOf    []func(fd uintptr) // reads them (unacked)

	// Receive side, one goroutine at a time: the lanes the peer said carry
	// its data frames, and the stripes and length of the payload the last
	// header announced (rstripes < 2: not striped).
	ractive  int
	rstripes int
	rlen     int
}

var (
	_ transport.ChunkHinter = (*lanedLink)(nil)
	_ transport.ChunkHinter = (*link)(nil)
)

// OversubscribedChunkBytes is the first lane's (transport.ChunkHinter).
func (l *lanedLink) OversubscribedChunkBytes() int { return l.lanes[0].OversubscribedChunkBytes() }

// laneJob is one stripe for a lane's goroutine to move.
type laneJob struct {
	ctx context.Context
	buf []byte
}

// laneWorker is the goroutine that serves one direction of one lane: it
// takes a job, moves the stripe and answers on done. At most one job is
// outstanding, so neither channel ever blocks the caller.
type laneWorker struct {
	jobs   chan laneJob
	done   chan error
	exited chan struct{}
}

// newLanedLink makes a link over lanes; auto: its sender measures how many
// of them to use (see laneChooser), else it uses them all.
func newLanedLink(lanes []*link, auto bool) *lanedLink {
	l := &lanedLink{
		lanes:   lanes,
		sendTo:  make([]laneWorker, len(lanes)),
		recvOn:  make([]laneWorker, len(lanes)),
		quit:    make(chan struct{}),
		sactive: len(lanes),
		ractive: len(lanes),
		auto:    auto && len(lanes) > 1,
	}
	l.readQueues()
	l.chooser = newLaneChooser(len(lanes), autoWarmBytes, autoTrialBytes, l.unacked)
	l.probing.Store(l.auto)
	for k := 1; k < len(lanes); k++ {
		l.sendTo[k].start(func(ctx context.Context, b []byte) error { return lanes[k].sendStripe(ctx, nil, b) }, l.quit)
		l.recvOn[k].start(lanes[k].recvStripe, l.quit)
	}
	return l
}

func (w *laneWorker) start(move func(context.Context, []byte) error, quit <-chan struct{}) {
	w.jobs = make(chan laneJob, 1)
	w.done = make(chan error, 1)
	w.exited = make(chan struct{})
	go func() {
		defer close(w.exited)
		for {
			select {
			case j := <-w.jobs:
				w.done <- move(j.ctx, j.buf)
			case <-quit:
				return
			}
		}
	}()
}

// wait returns the outcome of the job given to w, once w no longer
// touches its buffer.
func (w *laneWorker) wait() error {
	select {
	case err := <-w.done:
		return err
	case <-w.exited:
		return transport.ErrLinkClosed
	}
}

func (l *lanedLink) Peer() int          { return l.lanes[0].PeerRank }
func (l *lanedLink) RemoteAddr() string { return l.lanes[0].Addr }

// failed is the error every call fails with once the link is closed or
// broken, nil otherwise.
func (l *lanedLink) failed(op string) error {
	if l.closed.Load() {
		return l.lanes[0].PeerErr(op, transport.ErrLinkClosed)
	}
	if p := l.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records the failure of a striped frame, and closes the lanes
// unless the caller's context ended (then every lane's call has returned
// or returns by itself).
func (l *lanedLink) fail(op string, err error) error {
	if l.closed.Load() {
		return l.lanes[0].PeerErr(op, transport.ErrLinkClosed)
	}
	err = l.asPeerErr(op, err)
	l.broken.CompareAndSwap(nil, &err)
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		for _, ln := range l.lanes {
			ln.Close()
		}
	}
	return err
}

// firstFailure keeps the more telling of two lane errors: any error over
// none, and a lane's own failure over the ErrLinkClosed of a lane closed
// because of it.
func firstFailure(have, next error) error {
	if have == nil || (next != nil && errors.Is(have, transport.ErrLinkClosed) && !errors.Is(next, transport.ErrLinkClosed)) {
		return next
	}
	return have
}

// Send writes one frame: a small one on the first lane, a large one
// striped over the lanes in use.
func (l *lanedLink) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	if h.Kind != transport.FrameData || stripes(len(payload), len(l.lanes)) < 2 {
		// Whole on the first lane whatever the count in use.
		if err := l.failed("send"); err != nil {
			return err
		}
		if l.probing.Load() {
			l.unmetered.Add(int64(len(payload)))
		}
		return l.lanes[0].Send(ctx, h, payload)
	}
	l.smu.Lock()
	defer l.smu.Unlock()
	if err := transport.CheckOutgoing(h, payload); err != nil {
		return l.lanes[0].PeerErr("send", err)
	}
	if err := l.failed("send"); err != nil {
		return err
	}
	if err := l.announce(ctx); err != nil {
		return err
	}
	// Once the choice has settled, a frame is neither timed nor counted.
	measuring := l.probing.Load()
	var start time.Time
	if measuring {
		start = time.Now()
	}
	m := stripes(len(payload), l.sactive)
	if m < 2 {
		if err := l.lanes[0].Send(ctx, h, payload); err != nil {
			return err
		}
	} else {
		for k := 1; k < m; k++ {
			l.sendTo[k].jobs <- laneJob{ctx, stripe(payload, k, m)}
		}
		hh := *h
		err := l.lanes[0].sendStripe(ctx, &hh, stripe(payload, 0, m))
		for k := 1; k < m; k++ {
			err = firstFailure(err, l.sendTo[k].wait())
		}
		if err != nil {
			return l.fail("send", err)
		}
	}
	if measuring && l.chooser.observe(len(payload)+int(l.unmetered.Swap(0)), start, time.Now()) {
		l.probing.Store(false)
		if l.settled != nil {
			l.settled(l.chooser.lanes(), l.chooser.rates[:])
		}
	}
	return nil
}

// announce tells the peer, before a frame that may be striped, how many
// lanes carry it when that changed: a FrameLanes frame on the first lane,
// which orders it with the data frames. Called under smu.
func (l *lanedLink) announce(ctx context.Context) error {
	want := l.sactive
	if l.auto {
		want = l.chooser.lanes()
	}
	if want == l.sactive {
		return nil
	}
	h := transport.Header{Kind: transport.FrameLanes, Aux: uint32(want)}
	if err := l.lanes[0].Send(ctx, &h, nil); err != nil {
		return err
	}
	l.sactive = want
	return nil
}

// asPeerErr names the peer in err, which a lane's worker may return bare.
func (l *lanedLink) asPeerErr(op string, err error) error {
	var pe *transport.PeerError
	if errors.As(err, &pe) {
		return err
	}
	return l.lanes[0].PeerErr(op, err)
}

// RecvHeader reads the next frame's header, from the first lane; a
// FrameLanes frame on the way sets how many lanes carry the data frames
// after it.
func (l *lanedLink) RecvHeader(ctx context.Context, h *transport.Header) error {
	if err := l.failed("recv"); err != nil {
		return err
	}
	for {
		if err := l.lanes[0].RecvHeader(ctx, h); err != nil {
			return err
		}
		if h.Kind != transport.FrameLanes {
			break
		}
		n, err := checkLanesFrame(h, len(l.lanes))
		if err != nil {
			err.Peer = l.Peer()
			return l.fail("recv", err)
		}
		l.ractive = n
	}
	l.rstripes, l.rlen = 0, int(h.Length)
	if h.Kind == transport.FrameData {
		l.rstripes = stripes(l.rlen, l.ractive)
	}
	return nil
}

// checkLanesFrame returns the lane count a FrameLanes header announces
// for a link of lanes lanes, or why it cannot be.
func checkLanesFrame(h *transport.Header, lanes int) (int, *transport.FrameError) {
	if h.Length != 0 || h.Aux < 1 || h.Aux > uint32(lanes) {
		return 0, &transport.FrameError{Peer: -1, Reason: fmt.Sprintf("lanes frame for %d lanes (%d bytes) on a link of %d", h.Aux, h.Length, lanes)}
	}
	return int(h.Aux), nil
}

// RecvPayload reads the payload announced by the last header into p: a
// striped one from every lane at once.
func (l *lanedLink) RecvPayload(ctx context.Context, p []byte) error {
	m := l.rstripes
	if m < 2 {
		if err := l.failed("recv"); err != nil {
			return err
		}
		return l.lanes[0].RecvPayload(ctx, p)
	}
	if err := l.failed("recv"); err != nil {
		return err
	}
	if len(p) != l.rlen {
		return l.lanes[0].PeerErr("recv", fmt.Errorf("payload buffer of %d bytes for a frame of %d", len(p), l.rlen))
	}
	l.rstripes = 0
	for k := 1; k < m; k++ {
		l.recvOn[k].jobs <- laneJob{ctx, stripe(p, k, m)}
	}
	err := l.lanes[0].recvStripe(ctx, stripe(p, 0, m))
	for k := 1; k < m; k++ {
		err = firstFailure(err, l.recvOn[k].wait())
	}
	if err != nil {
		return l.fail("recv", err)
	}
	return nil
}

// Close tears every lane down; blocked calls return promptly with
// ErrLinkClosed, and the lanes' goroutines end.
func (l *lanedLink) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	close(l.quit)
	var err error
	for _, ln := range l.lanes {
		if cerr := ln.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// lanesOf returns the connections of a link this transport made.
func lanesOf(l transport.Link) []*link {
	switch tl := l.(type) {
	case *link:
		return []*link{tl}
	case *lanedLink:
		return tl.lanes
	}
	return nil
}
