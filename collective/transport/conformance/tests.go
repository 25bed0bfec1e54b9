package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
)

func (s *suite) testMesh(t *testing.T) {
	for p := 1; p <= 4; p++ {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			s.start(t)
			trs := s.listenN(t, p, defaultOptions())
			ctx := TimeoutCtx(t, 30*time.Second)
			links := ConnectAll(t, ctx, trs, "mesh", 1)
			for r, ls := range links {
				if len(ls) != p {
					t.Fatalf("rank %d: %d links, want %d", r, len(ls), p)
				}
				if ls[r] != nil {
					t.Fatalf("rank %d: link to itself is not nil", r)
				}
				for peer, l := range ls {
					if l != nil && (l.Peer() != peer || l.RemoteAddr() == "") {
						t.Fatalf("rank %d: link %d says peer %d at %q", r, peer, l.Peer(), l.RemoteAddr())
					}
				}
			}
			if err := Exchange(ctx, links, meshSizes()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// testHeaderFields: every field the caller owns arrives as sent; the
// transport sets job, epoch and sender, and leaves the caller's header alone.
func (s *suite) testHeaderFields(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 10*time.Second)
	payload := []byte("fields")
	h := transport.Header{Kind: transport.FrameData, Sender: 77, JobID: 1, Epoch: 99,
		Seq: 0x0102030405060708, Count: 0x1112131415161718, Step: 0x21222324, Length: uint32(len(payload)),
		Coll: 0x31, DType: 0x32, Op: 0x33, Flags: 0x34, Aux: 0x41424344, Tag: 0x5152535455565758}
	sent := h
	if err := a.Send(ctx, &h, payload); err != nil {
		t.Fatal(err)
	}
	if h != sent {
		t.Errorf("Send changed the caller's header: %+v, was %+v", h, sent)
	}
	var got transport.Header
	if err := b.RecvHeader(ctx, &got); err != nil {
		t.Fatal(err)
	}
	want := sent
	want.Sender, want.JobID, want.Epoch = 0, transport.JobHash("pair"), 1
	if got != want {
		t.Errorf("received header %+v, want %+v", got, want)
	}
	buf := make([]byte, got.Length)
	if err := b.RecvPayload(ctx, buf); err != nil || !bytes.Equal(buf, payload) {
		t.Fatalf("payload %q, %v", buf, err)
	}
}

func (s *suite) testOrdering(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 30*time.Second)
	sizes := make([]int, 300)
	x := uint32(12345)
	for i := range sizes {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		switch x % 4 {
		case 0:
			sizes[i] = 0
		case 1:
			sizes[i] = int(x % 100)
		case 2:
			sizes[i] = int(x % (20 << 10))
		default:
			sizes[i] = int(x % (200 << 10))
		}
	}
	if err := Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, sizes); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testLarge(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 60*time.Second)
	if err := Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, []int{17 << 20, 33<<20 + 5}); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testZeroByte(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 10*time.Second)
	sizes := make([]int, 201)
	sizes[100] = 10
	if err := Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, sizes); err != nil {
		t.Fatal(err)
	}
}

// testInline: a few InlinePayload frames are sent before the peer reads any.
func (s *suite) testInline(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 20*time.Second)
	const frames = 4
	err := within(t, 5*time.Second, "sending InlinePayload frames to a peer that does not read", func() error {
		for i := range frames {
			if err := Send(ctx, a, uint64(i), Pattern(transport.InlinePayload, 0, 1, i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range frames {
		if err := Recv(ctx, b, uint64(i), Pattern(transport.InlinePayload, 0, 1, i)); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *suite) testBidirectional(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 30*time.Second)
	sizes := make([]int, 48)
	for i := range sizes {
		sizes[i] = 256<<10 + i
	}
	if err := Exchange(ctx, [][]transport.Link{{nil, a}, {b, nil}}, sizes); err != nil {
		t.Fatal(err)
	}
}

// testConcurrentSenders: frames sent from several goroutines at once never interleave.
func (s *suite) testConcurrentSenders(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 30*time.Second)
	const senders, frames = 4, 20
	sizes := []int{10, 40 << 10, 300 << 10}
	errc := make(chan error, senders)
	for sn := range senders {
		go func() {
			for i := range frames {
				n := sizes[(sn+i)%len(sizes)]
				h := transport.Header{Kind: transport.FrameData, Seq: uint64(sn), Step: uint32(i), Length: uint32(n)}
				if err := a.Send(ctx, &h, Pattern(n, sn, i, 0)); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	next := make([]int, senders)
	for range senders * frames {
		var h transport.Header
		if err := b.RecvHeader(ctx, &h); err != nil {
			t.Fatal(err)
		}
		sn, i := int(h.Seq), int(h.Step)
		if sn >= senders || i != next[sn] {
			t.Fatalf("frame %d of sender %d out of order", i, sn)
		}
		next[sn]++
		buf := make([]byte, h.Length)
		if err := b.RecvPayload(ctx, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, Pattern(len(buf), sn, i, 0)) {
			t.Fatalf("frame %d of sender %d corrupted", i, sn)
		}
	}
	for range senders {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func (s *suite) testAbortFrame(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 10*time.Second)
	reason := []byte("rank 0 gives up")
	h := transport.Header{Kind: transport.FrameAbort, Length: uint32(len(reason))}
	if err := a.Send(ctx, &h, reason); err != nil {
		t.Fatal(err)
	}
	var got transport.Header
	if err := b.RecvHeader(ctx, &got); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, got.Length)
	if err := b.RecvPayload(ctx, buf); err != nil {
		t.Fatal(err)
	}
	if got.Kind != transport.FrameAbort || got.Sender != 0 || got.Epoch != 1 || !bytes.Equal(buf, reason) {
		t.Fatalf("got %+v %q", got, buf)
	}
}

// testMisuse: caller errors are reported without breaking the link.
func (s *suite) testMisuse(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 10*time.Second)
	for _, tc := range []struct {
		name    string
		h       transport.Header
		payload []byte
	}{
		{"length mismatch", transport.Header{Kind: transport.FrameData, Length: 3}, []byte("four")},
		{"unknown kind", transport.Header{Kind: 9, Length: 4}, []byte("four")},
		{"zero kind", transport.Header{Length: 4}, []byte("four")},
		{"abort too long", transport.Header{Kind: transport.FrameAbort, Length: transport.MaxAbortReason + 1}, make([]byte, transport.MaxAbortReason+1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			AsPeerError(t, a.Send(ctx, &tc.h, tc.payload), 1, nil)
		})
	}
	if err := Send(ctx, a, 1, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	var h transport.Header
	if err := b.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	AsPeerError(t, b.RecvPayload(ctx, make([]byte, 5)), 0, nil)
	AsPeerError(t, b.RecvHeader(ctx, &h), 0, nil) // payload not read yet
	if err := b.RecvPayload(ctx, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if err := Send(ctx, a, 2, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := Recv(ctx, b, 2, []byte("x")); err != nil {
		t.Fatal(err)
	}
}

// testPeerClose: frames sent before the peer closed are delivered, then the
// close shows as ErrPeerClosed, and stays.
func (s *suite) testPeerClose(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 20*time.Second)
	sizes := []int{10, 1 << 20, 0}
	errc := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			if err := Send(ctx, a, uint64(i), Pattern(n, 0, 1, i)); err != nil {
				errc <- err
				return
			}
		}
		errc <- a.Close()
	}()
	for i, n := range sizes {
		if err := Recv(ctx, b, uint64(i), Pattern(n, 0, 1, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var h transport.Header
	AsPeerError(t, b.RecvHeader(ctx, &h), 0, transport.ErrPeerClosed)
	AsPeerError(t, b.RecvHeader(ctx, &h), 0, transport.ErrPeerClosed)
}

func (s *suite) testPeerCloseWakesRecv(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	timer := time.AfterFunc(50*time.Millisecond, func() { a.Close() })
	defer timer.Stop()
	err := within(t, 5*time.Second, "RecvHeader after the peer closed", func() error {
		var h transport.Header
		return b.RecvHeader(context.Background(), &h)
	})
	AsPeerError(t, err, 0, transport.ErrPeerClosed)
}

func (s *suite) testSendToClosedPeer(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	b.Close()
	ctx := TimeoutCtx(t, 20*time.Second)
	payload := make([]byte, 1<<20)
	var err error
	// The first frames may still be buffered; the close shows within a few.
	for i := 0; i < 100 && err == nil; i++ {
		err = Send(ctx, a, uint64(i), payload)
	}
	AsPeerError(t, err, 1, transport.ErrPeerClosed)
}

// testCloseWakes: Close wakes calls blocked on the link, which then refuses
// every call.
func (s *suite) testCloseWakes(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(l transport.Link) error
	}{
		{"recv header", func(l transport.Link) error {
			var h transport.Header
			return l.RecvHeader(context.Background(), &h)
		}},
		{"send", func(l transport.Link) error { return fill(context.Background(), l, 1<<20) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.start(t)
			a, _ := s.pair(t, defaultOptions())
			timer := time.AfterFunc(100*time.Millisecond, func() { a.Close() })
			defer timer.Stop()
			err := within(t, 5*time.Second, "a call blocked while the link closed", func() error { return tc.op(a) })
			AsPeerError(t, err, 1, transport.ErrLinkClosed)
			AsPeerError(t, Send(context.Background(), a, 0, nil), 1, transport.ErrLinkClosed)
			var h transport.Header
			AsPeerError(t, a.RecvHeader(context.Background(), &h), 1, transport.ErrLinkClosed)
			if err := a.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// testContextCancel: cancelling the context wakes a blocked call at once; a
// RecvHeader cut short consumed nothing, so the link still works.
func (s *suite) testContextCancel(t *testing.T) {
	t.Run("recv header", func(t *testing.T) {
		s.start(t)
		a, b := s.pair(t, defaultOptions())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		timer := time.AfterFunc(50*time.Millisecond, cancel)
		defer timer.Stop()
		err := within(t, 2*time.Second, "RecvHeader after its context was cancelled", func() error {
			var h transport.Header
			return b.RecvHeader(ctx, &h)
		})
		AsPeerError(t, err, 0, context.Canceled)
		fresh := TimeoutCtx(t, 10*time.Second)
		if err := Send(fresh, a, 3, []byte("after the cancel")); err != nil {
			t.Fatal(err)
		}
		if err := Recv(fresh, b, 3, []byte("after the cancel")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("send", func(t *testing.T) {
		s.start(t)
		a, _ := s.pair(t, defaultOptions())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		timer := time.AfterFunc(100*time.Millisecond, cancel)
		defer timer.Stop()
		err := within(t, 5*time.Second, "Send after its context was cancelled", func() error { return fill(ctx, a, 1<<20) })
		AsPeerError(t, err, 1, context.Canceled)
	})
}

// testContextDeadline: a context deadline shorter than the I/O timeout is
// reported as the context's, not as the peer's silence.
func (s *suite) testContextDeadline(t *testing.T) {
	s.start(t)
	_, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 100*time.Millisecond)
	start := time.Now()
	var h transport.Header
	AsPeerError(t, b.RecvHeader(ctx, &h), 0, context.DeadlineExceeded)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("deadline of 100ms noticed after %v", d)
	}
}

// testCancelledContext: a context that has ended fails a call before any I/O;
// a fresh context works.
func (s *suite) testCancelledContext(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ctx := TimeoutCtx(t, 10*time.Second)
	cctx, cancel := context.WithCancel(ctx)
	if err := Send(cctx, a, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := Recv(cctx, b, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	cancel()
	AsPeerError(t, Send(cctx, a, 2, []byte("two")), 1, context.Canceled)
	var h transport.Header
	AsPeerError(t, b.RecvHeader(cctx, &h), 0, context.Canceled)
	if err := Send(ctx, a, 2, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := Recv(ctx, b, 2, []byte("two")); err != nil {
		t.Fatal(err)
	}
}

// testIOTimeout: a peer silent for IOTimeout fails a blocked call with
// ErrPeerTimeout; a timed-out RecvHeader may be retried.
func (s *suite) testIOTimeout(t *testing.T) {
	const ioTimeout = 200 * time.Millisecond
	o := defaultOptions()
	o.IOTimeout = ioTimeout
	t.Run("recv header", func(t *testing.T) {
		s.start(t)
		a, b := s.pair(t, o)
		ctx := TimeoutCtx(t, 20*time.Second)
		start := time.Now()
		var h transport.Header
		AsPeerError(t, b.RecvHeader(ctx, &h), 0, transport.ErrPeerTimeout)
		if d := time.Since(start); d < ioTimeout*3/4 || d > 15*ioTimeout {
			t.Errorf("timed out after %v, IOTimeout is %v", d, ioTimeout)
		}
		if err := Send(ctx, a, 5, []byte("late")); err != nil {
			t.Fatal(err)
		}
		if err := Recv(ctx, b, 5, []byte("late")); err != nil {
			t.Fatalf("RecvHeader after a timeout: %v", err)
		}
	})
	t.Run("send", func(t *testing.T) {
		s.start(t)
		a, _ := s.pair(t, o)
		ctx := TimeoutCtx(t, 20*time.Second)
		AsPeerError(t, fill(ctx, a, 4<<20), 1, transport.ErrPeerTimeout)
	})
}

// testSlowReceiver: IOTimeout bounds silence, not a transfer: a receiver that
// takes frames more slowly than the sender sends them, but never pauses for a
// whole IOTimeout, fails nothing.
func (s *suite) testSlowReceiver(t *testing.T) {
	s.start(t)
	const ioTimeout = 400 * time.Millisecond
	o := defaultOptions()
	o.IOTimeout = ioTimeout
	a, b := s.pair(t, o)
	ctx := TimeoutCtx(t, 30*time.Second)
	const frames, size = 8, 2 << 20
	// The payloads are made up front: under the race detector making 2 MiB
	// of pattern takes a good part of IOTimeout, which would count as the
	// receiver's silence (a single-copy sender waits for the receiver's copy).
	payloads := make([][]byte, frames)
	for i := range payloads {
		payloads[i] = Pattern(size, 0, 1, i)
	}
	errc := make(chan error, 1)
	go func() {
		for i := range frames {
			if err := Send(ctx, a, uint64(i), payloads[i]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	tick := time.NewTicker(ioTimeout / 4)
	defer tick.Stop()
	for i := range frames {
		<-tick.C
		if err := Recv(ctx, b, uint64(i), payloads[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// testWrongSecret: in a pair with different secrets, the dialer fails at once
// with a fatal HandshakeError; the acceptor, which cannot tell a misconfigured
// peer from a stranger, keeps waiting, and its error when its context ends
// carries the HandshakeError of the rank that failed.
func (s *suite) testWrongSecret(t *testing.T) {
	s.start(t)
	oa, ob := defaultOptions(), defaultOptions()
	ob.Secret = []byte("another secret entirely")
	a, b := s.listen(t, oa), s.listen(t, ob)
	addrs := []string{a.Addr(), b.Addr()}
	acceptErr := make(chan error, 1)
	go func() {
		_, err := a.Connect(TimeoutCtx(t, time.Second), transport.World{JobID: "job", Epoch: 1, Rank: 0, Addrs: addrs})
		acceptErr <- err
	}()
	start := time.Now()
	_, err := b.Connect(TimeoutCtx(t, 20*time.Second), transport.World{JobID: "job", Epoch: 1, Rank: 1, Addrs: addrs})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("wrong secret took %v to detect", d)
	}
	AsHandshakeError(t, err, 0, "wrong secret")
	err = <-acceptErr
	AsPeerError(t, err, 1, context.DeadlineExceeded)
	AsHandshakeError(t, err, 1, "wrong secret")
}

func (s *suite) testWrongJob(t *testing.T) {
	s.start(t)
	a, b := s.listen(t, defaultOptions()), s.listen(t, defaultOptions())
	addrs := []string{a.Addr(), b.Addr()}
	connErr := make(chan error, 1)
	go func() {
		_, err := a.Connect(TimeoutCtx(t, time.Second), transport.World{JobID: "job-a", Epoch: 1, Rank: 0, Addrs: addrs})
		connErr <- err
	}()
	_, err := b.Connect(TimeoutCtx(t, 20*time.Second), transport.World{JobID: "job-b", Epoch: 1, Rank: 1, Addrs: addrs})
	AsHandshakeError(t, err, 0, "wrong job")
	AsPeerError(t, <-connErr, 1, context.DeadlineExceeded)
}

// testStaleEpoch: a transport that has connected epoch 5, whichever rank it
// was, refuses a rank that dials it for epoch 4, and then connects epoch 6.
func (s *suite) testStaleEpoch(t *testing.T) {
	s.start(t)
	trs := s.listenN(t, 2, defaultOptions())
	ctx := TimeoutCtx(t, 20*time.Second)
	CloseAll(ConnectAll(t, ctx, trs, "job", 5))
	for r, tr := range trs {
		// A late transport, rank 1 of a world whose rank 0 is tr, dials tr.
		late := s.listen(t, defaultOptions())
		_, err := late.Connect(ctx, transport.World{JobID: "job", Epoch: 4, Rank: 1, Addrs: []string{tr.Addr(), late.Addr()}})
		if err == nil {
			t.Fatalf("epoch 5's rank %d accepted a dialer of epoch 4", r)
		}
		AsHandshakeError(t, err, 0, "stale epoch")
	}
	if err := Exchange(ctx, ConnectAll(t, ctx, trs, "job", 6), meshSizes()); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testEpochs(t *testing.T) {
	s.start(t)
	trs := s.listenN(t, 3, defaultOptions())
	ctx := TimeoutCtx(t, 30*time.Second)
	for _, epoch := range []uint64{5, 6} {
		links := ConnectAll(t, ctx, trs, "job", epoch)
		if err := Exchange(ctx, links, meshSizes()); err != nil {
			t.Fatalf("epoch %d: %v", epoch, err)
		}
		CloseAll(links)
	}
	if _, err := trs[0].Connect(ctx, transport.World{JobID: "job", Epoch: 5, Rank: 0, Addrs: AddrsOf(trs)}); err == nil {
		t.Fatal("Connect of an older epoch succeeded")
	}
	// Shrink: rank 0 leaves, the others renumber.
	if err := Exchange(ctx, ConnectAll(t, ctx, trs[1:], "job", 7), meshSizes()); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testSizeOne(t *testing.T) {
	s.start(t)
	tr := s.listen(t, defaultOptions())
	links, err := tr.Connect(TimeoutCtx(t, 10*time.Second), transport.World{JobID: "solo", Epoch: 1, Addrs: []string{tr.Addr()}})
	if err != nil || len(links) != 1 || links[0] != nil {
		t.Fatalf("Connect of a 1-rank world = %v, %v; want [nil], nil", links, err)
	}
}

func (s *suite) testValidate(t *testing.T) {
	s.start(t)
	tr := s.listen(t, defaultOptions())
	ctx := TimeoutCtx(t, 5*time.Second)
	for _, tc := range []struct {
		name string
		w    transport.World
	}{
		{"empty job", transport.World{Epoch: 1, Rank: 0, Addrs: []string{"a", "b"}}},
		{"no ranks", transport.World{JobID: "j", Epoch: 1}},
		{"rank out of range", transport.World{JobID: "j", Epoch: 1, Rank: 2, Addrs: []string{"a", "b"}}},
		{"missing address", transport.World{JobID: "j", Epoch: 1, Rank: 1, Addrs: []string{"", tr.Addr()}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tr.Connect(ctx, tc.w); err == nil {
				t.Fatal("Connect succeeded")
			}
		})
	}
}

// testMissingRank: ranks that never come are named when the context ends.
func (s *suite) testMissingRank(t *testing.T) {
	s.start(t)
	trs := s.listenN(t, 2, defaultOptions())
	gone := s.f.New(t, defaultOptions())
	goneAddr := gone.Addr()
	gone.Close()
	addrs := []string{goneAddr, trs[0].Addr(), trs[1].Addr(), goneAddr}
	ctx := TimeoutCtx(t, 500*time.Millisecond)
	start := time.Now()
	res := make([]error, 2)
	var wg sync.WaitGroup
	for i, tr := range trs {
		wg.Go(func() {
			_, res[i] = tr.Connect(ctx, transport.World{JobID: "missing", Epoch: 2, Rank: i + 1, Addrs: addrs})
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Connect took %v to give up", d)
	}
	// Ranks 1 and 2 both miss rank 0 (nobody answers its address) and rank 3
	// (it never dials in).
	for i, err := range res {
		pe := AsPeerError(t, err, 0, context.DeadlineExceeded)
		if !strings.Contains(pe.Error(), "[0 3]") {
			t.Errorf("rank %d's error %q does not name ranks 0 and 3", i+1, pe)
		}
	}
}

func (s *suite) testCloseDuringConnect(t *testing.T) {
	s.start(t)
	a := s.listen(t, defaultOptions())
	ctx := TimeoutCtx(t, 20*time.Second)
	connErr := make(chan error, 1)
	go func() {
		_, err := a.Connect(ctx, transport.World{JobID: "job", Epoch: 1, Rank: 0, Addrs: []string{a.Addr(), ""}})
		connErr <- err
	}()
	a.Close()
	select {
	case err := <-connErr:
		if err == nil {
			t.Fatal("Connect succeeded on a closed transport")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a pending Connect")
	}
	if _, err := a.Connect(ctx, transport.World{JobID: "job", Epoch: 2, Rank: 0, Addrs: []string{a.Addr(), ""}}); err == nil {
		t.Fatal("Connect after Close succeeded")
	}
}

func (s *suite) testLinksOutlive(t *testing.T) {
	s.start(t)
	trs := s.listenN(t, 2, defaultOptions())
	ctx := TimeoutCtx(t, 20*time.Second)
	links := ConnectAll(t, ctx, trs, "job", 1)
	for _, tr := range trs {
		tr.Close()
	}
	if err := Exchange(ctx, links, meshSizes()); err != nil {
		t.Fatal(err)
	}
}

// testZeroAllocs: the steady-state send and receive path allocates nothing.
func (s *suite) testZeroAllocs(t *testing.T) {
	if !s.f.ZeroAllocs {
		t.Skip("the transport does not promise an allocation-free path")
	}
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	deadline := TimeoutCtx(t, 60*time.Second)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		n   int
		ctx context.Context
	}{
		{0, context.Background()},
		{4096, context.Background()},
		{1 << 20, context.Background()},
		{4096, cctx},
		{1 << 20, deadline},
	} {
		n, ctx := tc.n, tc.ctx
		payload, buf, rbuf := make([]byte, n), make([]byte, n), make([]byte, n)
		h := transport.Header{Kind: transport.FrameData, Length: uint32(n)}
		const runs = 50
		done := make(chan error, 1)
		go func() {
			var rh transport.Header
			for range runs + 1 {
				if err := b.RecvHeader(ctx, &rh); err != nil {
					done <- err
					return
				}
				if err := b.RecvPayload(ctx, buf); err != nil {
					done <- err
					return
				}
				if err := b.Send(ctx, &rh, buf); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		var rh transport.Header
		var callErr error
		allocs := testing.AllocsPerRun(runs, func() {
			if callErr != nil {
				return
			}
			if callErr = a.Send(ctx, &h, payload); callErr != nil {
				return
			}
			if callErr = a.RecvHeader(ctx, &rh); callErr != nil {
				return
			}
			callErr = a.RecvPayload(ctx, rbuf)
		})
		if callErr != nil {
			t.Fatal(callErr)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if allocs != 0 {
			t.Errorf("%d-byte round trip with %v: %v allocations, want 0", n, ctx, allocs)
		}
	}
}

// testCollectives runs the collectives over the transport's links and checks
// exact results: with small chunks, so the ring pipelines several frames per
// segment, and with the default ones, whose frames a transport may move in
// several pieces (TCP writes them with writev(2), which the race detector must
// see as ordering too in a world mixing TCP and shared-memory links: the
// ring's write-after-read ordering runs around the ring through both).
func (s *suite) testCollectives(t *testing.T) {
	small := collective.DefaultConfig()
	small.ChunkBytes, small.SmallMessageBytes = 32<<10, 8<<10
	t.Run("small chunks", func(t *testing.T) { s.collectives(t, small) })
	t.Run("default", func(t *testing.T) { s.collectives(t, collective.DefaultConfig()) })
}

func (s *suite) collectives(t *testing.T, cfg collective.Config) {
	s.start(t)
	const p = 3
	trs := s.listenN(t, p, defaultOptions())
	ctx := TimeoutCtx(t, 60*time.Second)
	links := ConnectAll(t, ctx, trs, "collectives", 1)
	comms := make([]*collective.Communicator, p)
	for r := range p {
		c, err := collective.NewFromLinks(transport.World{JobID: "collectives", Epoch: 1, Rank: r, Addrs: AddrsOf(trs)}, links[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	run := func(name string, fn func(c *collective.Communicator) error) {
		t.Helper()
		errs := make([]error, p)
		var wg sync.WaitGroup
		for r, c := range comms {
			wg.Go(func() { errs[r] = fn(c) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Inputs are small integers, so every order of summation is exact.
	in := func(r, i int) int { return (r+1)*(i%7) + 1 }
	for _, n := range []int{1, 1000, 5000, 300000, 1 << 20} {
		run(fmt.Sprintf("allreduce float32 sum of %d", n), func(c *collective.Communicator) error {
			src, dst := make([]float32, n), make([]float32, n)
			for i := range src {
				src[i] = float32(in(c.Rank(), i))
			}
			if err := collective.Allreduce(ctx, c, src, dst, collective.Sum); err != nil {
				return err
			}
			for i, v := range dst {
				want := 0
				for r := range p {
					want += in(r, i)
				}
				if v != float32(want) {
					return fmt.Errorf("rank %d: element %d is %v, want %d", c.Rank(), i, v, want)
				}
			}
			return nil
		})
	}
	run("allreduce float64 max", func(c *collective.Communicator) error {
		buf := make([]float64, 70000)
		for i := range buf {
			buf[i] = float64(in(c.Rank(), i))
		}
		if err := collective.Allreduce(ctx, c, buf, buf, collective.Max); err != nil {
			return err
		}
		for i, v := range buf {
			if v != float64(in(p-1, i)) {
				return fmt.Errorf("rank %d: element %d is %v", c.Rank(), i, v)
			}
		}
		return nil
	})
	run("allreduce int32 average", func(c *collective.Communicator) error {
		buf := make([]int32, 40000)
		for i := range buf {
			buf[i] = int32(3 * (c.Rank() + 1) * (i % 5))
		}
		if err := collective.Allreduce(ctx, c, buf, buf, collective.Average); err != nil {
			return err
		}
		for i, v := range buf {
			if v != int32(2*3*(i%5)) {
				return fmt.Errorf("rank %d: element %d is %v", c.Rank(), i, v)
			}
		}
		return nil
	})
	run("allreduce bfloat16 sum", func(c *collective.Communicator) error {
		buf := make([]collective.BF16, 100000)
		for i := range buf {
			buf[i] = collective.NewBF16(float32(i % 3))
		}
		if err := collective.Allreduce(ctx, c, buf, buf, collective.Sum); err != nil {
			return err
		}
		for i, v := range buf {
			if v.Float32() != float32(p*(i%3)) {
				return fmt.Errorf("rank %d: element %d is %v", c.Rank(), i, v)
			}
		}
		return nil
	})
	run("reducescatter float32 average", func(c *collective.Communicator) error {
		const n = 200000 // per rank
		send, recv := make([]float32, p*n), make([]float32, n)
		for i := range send {
			send[i] = float32(p * in(c.Rank(), i))
		}
		if err := collective.ReduceScatter(ctx, c, send, recv, collective.Average); err != nil {
			return err
		}
		for i, v := range recv {
			want := 0
			for r := range p {
				want += in(r, c.Rank()*n+i)
			}
			if v != float32(want) {
				return fmt.Errorf("rank %d: element %d is %v, want %d", c.Rank(), i, v, want)
			}
		}
		return nil
	})
	run("broadcast", func(c *collective.Communicator) error {
		buf := make([]byte, 200000)
		if c.Rank() == 1 {
			copy(buf, Pattern(len(buf), 1, 1, 1))
		}
		if err := collective.Broadcast(ctx, c, buf, 1); err != nil {
			return err
		}
		if !bytes.Equal(buf, Pattern(len(buf), 1, 1, 1)) {
			return fmt.Errorf("rank %d: broadcast differs", c.Rank())
		}
		return nil
	})
	run("allgather", func(c *collective.Communicator) error {
		const n = 50000
		send, recv := Pattern(n, c.Rank(), 0, 0), make([]byte, p*n)
		if err := collective.Allgather(ctx, c, send, recv); err != nil {
			return err
		}
		for r := range p {
			if !bytes.Equal(recv[r*n:(r+1)*n], Pattern(n, r, 0, 0)) {
				return fmt.Errorf("rank %d: block %d differs", c.Rank(), r)
			}
		}
		return nil
	})
}

// testInPlace: links that hand payloads over in place (transport.InPlaceLink)
// deliver every byte, in order, in pieces that are multiples of 64 bytes but
// the last, whichever of Send and SendInPlace sent the frame; a consumer that
// fails ends the call with its error and breaks the link.
func (s *suite) testInPlace(t *testing.T) {
	s.start(t)
	a, b := s.pair(t, defaultOptions())
	ia, okA := a.(transport.InPlaceLink)
	ib, okB := b.(transport.InPlaceLink)
	if !okA || !okB {
		t.Skip("links do not implement transport.InPlaceLink")
	}
	ctx := TimeoutCtx(t, 60*time.Second)
	sizes := []int{0, 1, 63, 64, 100, 4104, 200 << 10, 1<<20 + 12, 5<<20 + 64}
	errc := make(chan error, 1)
	go func() {
		for i := range 2 * len(sizes) {
			p := Pattern(sizes[i/2], 0, 1, i)
			h := transport.Header{Kind: transport.FrameData, Seq: uint64(i), Length: uint32(len(p))}
			var err error
			if i%2 == 0 {
				err = ia.SendInPlace(ctx, &h, p)
			} else {
				err = a.Send(ctx, &h, p)
			}
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range 2 * len(sizes) {
		want := Pattern(sizes[i/2], 0, 1, i)
		var h transport.Header
		if err := b.RecvHeader(ctx, &h); err != nil {
			t.Fatal(err)
		}
		if h.Seq != uint64(i) || int(h.Length) != len(want) {
			t.Fatalf("frame %d: header seq %d length %d", i, h.Seq, h.Length)
		}
		var got []byte
		pieces := 0
		err := ib.RecvPayloadInPlace(ctx, make([]byte, len(want)), func(off int, piece []byte) error {
			if off != len(got) {
				return fmt.Errorf("piece at offset %d after %d bytes", off, len(got))
			}
			if off+len(piece) < len(want) && len(piece)%64 != 0 {
				return fmt.Errorf("piece of %d bytes at offset %d of %d is not a multiple of 64", len(piece), off, len(want))
			}
			got = append(got, piece...)
			pieces++
			return nil
		})
		if err != nil {
			t.Fatalf("frame %d (%d bytes): %v", i, len(want), err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes in %d pieces differ from the %d sent", i, len(got), pieces, len(want))
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	// A consumer that fails.
	boom := errors.New("consumer failed")
	if err := ia.SendInPlace(ctx, &transport.Header{Kind: transport.FrameData, Length: 1000}, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	var h transport.Header
	if err := b.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	err := ib.RecvPayloadInPlace(ctx, make([]byte, 1000), func(int, []byte) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("failing consumer: %v, want %v", err, boom)
	}
	var pe *transport.PeerError
	if err := b.RecvHeader(ctx, &h); !errors.As(err, &pe) {
		t.Fatalf("RecvHeader after a failed consumer: %v, want a *transport.PeerError", err)
	}
}

// testWakesWhilePolling: a call that polls rather than sleeps (SpinTime longer
// than the test) still ends at once when its context is cancelled or the link
// closes, as Abort does.
func (s *suite) testWakesWhilePolling(t *testing.T) {
	o := defaultOptions()
	o.SpinTime = time.Hour
	recvHeader := func(ctx context.Context, l transport.Link) error {
		var h transport.Header
		return l.RecvHeader(ctx, &h)
	}
	fillUp := func(ctx context.Context, l transport.Link) error { return fill(ctx, l, 1<<20) }
	for _, tc := range []struct {
		name  string
		op    func(ctx context.Context, l transport.Link) error
		close bool // else cancel the context
		want  error
	}{
		{"recv header cancelled", recvHeader, false, context.Canceled},
		{"recv header closed", recvHeader, true, transport.ErrLinkClosed},
		{"send cancelled", fillUp, false, context.Canceled},
		{"send closed", fillUp, true, transport.ErrLinkClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.start(t)
			a, _ := s.pair(t, o)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := cancel
			if tc.close {
				stop = func() { a.Close() }
			}
			timer := time.AfterFunc(100*time.Millisecond, stop)
			defer timer.Stop()
			err := within(t, 5*time.Second, "a polling call", func() error { return tc.op(ctx, a) })
			AsPeerError(t, err, 1, tc.want)
		})
	}
}

// testSilentPeerCostsNoCPU: waiting on a peer that sends nothing (or reads
// nothing) sleeps: whatever polling a transport does before it parks is
// bounded, so a blocked job leaves the CPUs to others. The CPU time is the
// whole process's, so the garbage collector or a straggling goroutine of an
// earlier test may add to one wait; of three waits, the quietest must stay
// under a tenth of a core (one that polled throughout would use all of it).
func (s *suite) testSilentPeerCostsNoCPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, l transport.Link) error
		wait time.Duration
		// from is when the measured wait starts: a sender first fills the
		// transport's buffers, at whatever that costs.
		from time.Duration
	}{
		{"recv header", func(ctx context.Context, l transport.Link) error {
			var h transport.Header
			return l.RecvHeader(ctx, &h)
		}, 400 * time.Millisecond, 0},
		{"send", func(ctx context.Context, l transport.Link) error { return fill(ctx, l, 64<<10) },
			time.Second, 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.start(t)
			// Several waits, as a job's successive collectives would make (a
			// send that failed breaks its link: a fresh one each time).
			a, _ := s.pair(t, defaultOptions())
			quietest := 1.0
			var waits []string
			// A wait counts when its measurement covered at least a quarter
			// of it: on a loaded machine the timer that starts it may fire
			// late. Up to six tries for three that count.
			for i := 0; len(waits) < 3 && i < 6; i++ {
				if i > 0 && tc.from > 0 {
					a, _ = s.pair(t, defaultOptions())
				}
				runtime.GC()
				ctx, cancel := context.WithTimeout(context.Background(), tc.wait)
				var cpu0 time.Duration
				var t0 time.Time
				mark := func() { cpu0, t0 = processCPU(t), time.Now() }
				marked := make(chan struct{})
				if tc.from == 0 {
					mark()
					close(marked)
				} else {
					timer := time.AfterFunc(tc.from, func() { mark(); close(marked) })
					defer timer.Stop()
				}
				err := tc.op(ctx, a)
				<-marked
				cpu, elapsed := processCPU(t)-cpu0, time.Since(t0)
				cancel()
				AsPeerError(t, err, 1, context.DeadlineExceeded)
				if elapsed < tc.wait/4 {
					t.Logf("wait %d: the call returned %v after its measured wait began: not counted", i, elapsed)
					continue
				}
				quietest = min(quietest, cpu.Seconds()/elapsed.Seconds())
				waits = append(waits, fmt.Sprintf("%v of CPU in %v", cpu, elapsed.Round(time.Millisecond)))
			}
			if len(waits) == 0 {
				t.Fatalf("none of six waits could be measured: each returned within a quarter of its length after its measurement began")
			}
			t.Logf("quietest %.3f: %s", quietest, strings.Join(waits, ", "))
			if quietest > 0.1 {
				t.Errorf("blocked on a silent peer, the quietest of three waits used %.0f%% of a core: %s",
					100*quietest, strings.Join(waits, ", "))
			}
		})
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
