package tcp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// TestPeerClosesMidFrame: the peer dies after half a payload.
func TestPeerClosesMidFrame(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes func(p *rawPeer) []byte
	}{
		{"mid header", func(p *rawPeer) []byte {
			return p.frame(transport.Header{Length: 100}, make([]byte, 100))[:20]
		}},
		{"mid payload", func(p *rawPeer) []byte {
			return p.frame(transport.Header{Length: 100}, make([]byte, 100))[:p.headerLen()+40]
		}},
		{"mid large payload", func(p *rawPeer) []byte {
			return p.frame(transport.Header{Length: 1 << 20}, make([]byte, 1<<20))[:p.headerLen()+600<<10]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			l, p := rawWorld(t, listen(t, testConfig()), "job", 1)
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			go func() {
				p.conn.Write(tc.bytes(p))
				p.conn.Close()
			}()
			var h transport.Header
			err := l.RecvHeader(ctx, &h)
			if err == nil {
				err = l.RecvPayload(ctx, make([]byte, h.Length))
			}
			conformance.AsPeerError(t, err, 1, transport.ErrPeerClosed)
			// The link stays broken.
			conformance.AsPeerError(t, l.RecvHeader(ctx, &h), 1, transport.ErrPeerClosed)
		})
	}
}

func TestSendToClosedPeer(t *testing.T) {
	checkNoLeaks(t)
	l, p := rawWorld(t, listen(t, testConfig()), "job", 1)
	p.conn.Close()
	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	payload := make([]byte, 1<<20)
	var err error
	// The first writes may still land in the socket buffer; the peer's reset
	// surfaces within a few.
	for i := 0; i < 100 && err == nil; i++ {
		err = conformance.Send(ctx, l, uint64(i), payload)
	}
	conformance.AsPeerError(t, err, 1, transport.ErrPeerClosed)
}

func TestPeerSilent(t *testing.T) {
	const ioTimeout = 200 * time.Millisecond
	cfg := testConfig()
	cfg.IOTimeout = ioTimeout
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, l transport.Link, p *rawPeer) error
	}{
		{"recv header", func(ctx context.Context, l transport.Link, p *rawPeer) error {
			var h transport.Header
			return l.RecvHeader(ctx, &h)
		}},
		{"recv payload", func(ctx context.Context, l transport.Link, p *rawPeer) error {
			p.conn.Write(p.frame(transport.Header{Length: 1000}, make([]byte, 1000))[:p.headerLen()+10])
			var h transport.Header
			if err := l.RecvHeader(ctx, &h); err != nil {
				return err
			}
			return l.RecvPayload(ctx, make([]byte, h.Length))
		}},
		{"send", func(ctx context.Context, l transport.Link, p *rawPeer) error {
			// The peer reads nothing, so the socket buffers fill up.
			payload := make([]byte, 4<<20)
			for i := 0; ; i++ {
				if err := conformance.Send(ctx, l, uint64(i), payload); err != nil {
					return err
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			l, p := rawWorld(t, listen(t, cfg), "job", 1)
			ctx := conformance.TimeoutCtx(t, 20*time.Second)
			start := time.Now()
			err := tc.op(ctx, l, p)
			elapsed := time.Since(start)
			conformance.AsPeerError(t, err, 1, transport.ErrPeerTimeout)
			if tc.name != "send" && (elapsed < ioTimeout*3/4 || elapsed > 10*ioTimeout) {
				t.Errorf("timed out after %v, IOTimeout is %v", elapsed, ioTimeout)
			}
		})
	}
}

// TestSlowPeerIsNotSilent: a payload that trickles in over several I/O timeouts
// still arrives, because the timeout bounds silence, not the transfer.
func TestSlowPeerIsNotSilent(t *testing.T) {
	checkNoLeaks(t)
	const ioTimeout = 300 * time.Millisecond
	cfg := testConfig()
	cfg.IOTimeout = ioTimeout
	cfg.ReadBufferSize = 4 << 10
	l, p := rawWorld(t, listen(t, cfg), "job", 1)
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	payload := conformance.Pattern(64<<10, 1, 0, 0)
	frame := p.frame(transport.Header{Seq: 0, Length: uint32(len(payload))}, payload)
	go func() {
		// 8 chunks, one every ioTimeout/3: the whole frame takes ~3 timeouts.
		tick := time.NewTicker(ioTimeout / 3)
		defer tick.Stop()
		for chunk := len(frame)/8 + 1; len(frame) > 0; <-tick.C {
			n := min(chunk, len(frame))
			if _, err := p.conn.Write(frame[:n]); err != nil {
				return
			}
			frame = frame[n:]
		}
	}()
	if err := conformance.Recv(ctx, l, 0, payload); err != nil {
		t.Fatal(err)
	}
}

func TestRecvCancel(t *testing.T) {
	checkNoLeaks(t)
	l, p := rawWorld(t, listen(t, testConfig()), "job", 1) // IOTimeout 20s
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	timer := time.AfterFunc(50*time.Millisecond, cancel)
	defer timer.Stop()
	start := time.Now()
	var h transport.Header
	err := l.RecvHeader(ctx, &h)
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("cancel woke RecvHeader after %v", elapsed)
	}
	conformance.AsPeerError(t, err, 1, context.Canceled)

	// Nothing was consumed, so the link still works.
	payload := []byte("after the cancel")
	p.conn.Write(p.frame(transport.Header{Seq: 3, Step: 3, Length: uint32(len(payload))}, payload))
	if err := conformance.Recv(conformance.TimeoutCtx(t, 10*time.Second), l, 3, payload); err != nil {
		t.Fatal(err)
	}
}

func TestRecvPayloadCancel(t *testing.T) {
	checkNoLeaks(t)
	l, p := rawWorld(t, listen(t, testConfig()), "job", 1)
	p.conn.Write(p.frame(transport.Header{Length: 1000}, make([]byte, 1000))[:p.headerLen()+10])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var h transport.Header
	if err := l.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(50*time.Millisecond, cancel)
	defer timer.Stop()
	conformance.AsPeerError(t, l.RecvPayload(ctx, make([]byte, h.Length)), 1, context.Canceled)
	// Half a payload was consumed: the link is broken for good.
	if err := l.RecvHeader(context.Background(), &h); err == nil {
		t.Fatal("RecvHeader after a cut payload succeeded")
	}
}

func TestRecvContextDeadline(t *testing.T) {
	checkNoLeaks(t)
	l, _ := rawWorld(t, listen(t, testConfig()), "job", 1)
	ctx := conformance.TimeoutCtx(t, 100*time.Millisecond)
	var h transport.Header
	conformance.AsPeerError(t, l.RecvHeader(ctx, &h), 1, context.DeadlineExceeded)
}

// TestCancelWhileIdle: a context that ends between calls fails the next call
// made with it at once, and a fresh context works.
func TestCancelWhileIdle(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	a, b := links[0][1], links[1][0]
	cctx, cancel := context.WithCancel(ctx)
	if err := conformance.Send(cctx, a, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := conformance.Recv(cctx, b, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	cancel()
	conformance.AsPeerError(t, conformance.Send(cctx, a, 2, []byte("two")), 1, context.Canceled)
	var h transport.Header
	conformance.AsPeerError(t, b.RecvHeader(cctx, &h), 0, context.Canceled)
	if err := conformance.Send(ctx, a, 2, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := conformance.Recv(ctx, b, 2, []byte("two")); err != nil {
		t.Fatal(err)
	}
}

func TestCloseWakesRecv(t *testing.T) {
	checkNoLeaks(t)
	l, _ := rawWorld(t, listen(t, testConfig()), "job", 1)
	errc := make(chan error, 1)
	go func() {
		var h transport.Header
		errc <- l.RecvHeader(context.Background(), &h)
	}()
	timer := time.AfterFunc(50*time.Millisecond, func() { l.Close() })
	defer timer.Stop()
	select {
	case err := <-errc:
		conformance.AsPeerError(t, err, 1, transport.ErrLinkClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake RecvHeader")
	}
	conformance.AsPeerError(t, conformance.Send(context.Background(), l, 0, nil), 1, transport.ErrLinkClosed)
}

// TestBadFrames: a frame that does not belong to the link's world is a
// FrameError naming the peer, and the link stays broken.
func TestBadFrames(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(b []byte)
	}{
		{"bad magic", func(b []byte) { b[0] = 'X' }},
		{"bad version", func(b []byte) { b[2] = 99 }},
		{"unknown kind", func(b []byte) { b[3] = 77 }},
		{"other job", func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 12345) }},
		{"other epoch", func(b []byte) { binary.LittleEndian.PutUint64(b[16:], 2) }},
		{"other sender", func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 0) }},
		{"huge length", func(b []byte) { binary.LittleEndian.PutUint32(b[44:], transport.MaxPayload+1) }},
		{"huge abort", func(b []byte) {
			b[3] = uint8(transport.FrameAbort)
			binary.LittleEndian.PutUint32(b[44:], transport.MaxAbortReason+1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			l, p := rawWorld(t, listen(t, testConfig()), "job", 1)
			p.conn.Write(p.frameWith(transport.Header{Length: 4}, []byte("data"), tc.mutate))
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			var h transport.Header
			err := l.RecvHeader(ctx, &h)
			conformance.AsPeerError(t, err, 1, nil)
			var fe *transport.FrameError
			if !errors.As(err, &fe) || fe.Peer != 1 {
				t.Fatalf("error %v is not a FrameError from rank 1", err)
			}
			if err := l.RecvHeader(ctx, &h); !errors.As(err, &fe) {
				t.Fatalf("second RecvHeader: %v, want the FrameError again", err)
			}
		})
	}
}

func TestAbortFrame(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	reason := []byte("rank 0 gives up")
	h := transport.Header{Kind: transport.FrameAbort, Length: uint32(len(reason))}
	if err := links[0][1].Send(ctx, &h, reason); err != nil {
		t.Fatal(err)
	}
	var got transport.Header
	if err := links[1][0].RecvHeader(ctx, &got); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, got.Length)
	if err := links[1][0].RecvPayload(ctx, buf); err != nil {
		t.Fatal(err)
	}
	if got.Kind != transport.FrameAbort || got.Sender != 0 || got.Epoch != 1 || !bytes.Equal(buf, reason) {
		t.Fatalf("got %+v %q", got, buf)
	}
}

// TestMisuse: caller errors are reported without breaking the link.
func TestMisuse(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	a, b := links[0][1], links[1][0]
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
			conformance.AsPeerError(t, a.Send(ctx, &tc.h, tc.payload), 1, nil)
		})
	}
	if err := conformance.Send(ctx, a, 1, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	var h transport.Header
	if err := b.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	conformance.AsPeerError(t, b.RecvPayload(ctx, make([]byte, 5)), 0, nil)
	conformance.AsPeerError(t, b.RecvHeader(ctx, &h), 0, nil) // payload not read yet
	if err := b.RecvPayload(ctx, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	// A cancelled context fails before any I/O.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	conformance.AsPeerError(t, conformance.Send(cctx, a, 2, []byte("x")), 1, context.Canceled)
	conformance.AsPeerError(t, b.RecvHeader(cctx, &h), 0, context.Canceled)
	if err := conformance.Send(ctx, a, 2, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := conformance.Recv(ctx, b, 2, []byte("x")); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentSends: frames sent from several goroutines at once never interleave.
func TestConcurrentSends(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 30*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	const senders, frames = 4, 20
	sizes := []int{10, 40 << 10, 300 << 10}
	errc := make(chan error, senders)
	for s := range senders {
		go func() {
			for i := range frames {
				n := sizes[(s+i)%len(sizes)]
				h := transport.Header{Kind: transport.FrameData, Seq: uint64(s), Step: uint32(i), Length: uint32(n)}
				if err := links[0][1].Send(ctx, &h, conformance.Pattern(n, s, i, 0)); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	next := make([]int, senders)
	r := links[1][0]
	for range senders * frames {
		var h transport.Header
		if err := r.RecvHeader(ctx, &h); err != nil {
			t.Fatal(err)
		}
		s, i := int(h.Seq), int(h.Step)
		if s >= senders || i != next[s] {
			t.Fatalf("frame %d of sender %d out of order (want %d)", i, s, next[s])
		}
		next[s]++
		buf := make([]byte, h.Length)
		if err := r.RecvPayload(ctx, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, conformance.Pattern(len(buf), s, i, 0)) {
			t.Fatalf("frame %d of sender %d corrupted", i, s)
		}
	}
	for range senders {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestZeroAllocs: the steady-state send and receive path allocates nothing.
func TestZeroAllocs(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 30*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
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
		{1 << 20, ctx}, // with a deadline
	} {
		n, bg := tc.n, tc.ctx
		payload := make([]byte, n)
		buf := make([]byte, n)
		h := transport.Header{Kind: transport.FrameData, Length: uint32(n)}
		done := make(chan error, 1)
		const runs = 50
		go func() {
			// Echo everything back.
			var rh transport.Header
			for range runs + 1 {
				if err := links[1][0].RecvHeader(bg, &rh); err != nil {
					done <- err
					return
				}
				if err := links[1][0].RecvPayload(bg, buf); err != nil {
					done <- err
					return
				}
				if err := links[1][0].Send(bg, &rh, buf); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		var rh transport.Header
		rbuf := make([]byte, n)
		allocs := testing.AllocsPerRun(runs, func() {
			if err := links[0][1].Send(bg, &h, payload); err != nil {
				t.Fatal(err)
			}
			if err := links[0][1].RecvHeader(bg, &rh); err != nil {
				t.Fatal(err)
			}
			if err := links[0][1].RecvPayload(bg, rbuf); err != nil {
				t.Fatal(err)
			}
		})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if allocs != 0 {
			t.Errorf("%d-byte round trip with %v: %v allocations, want 0", n, bg, allocs)
		}
	}
}

// Compile-time check that the exported type is a transport.Transport.
var _ transport.Transport = (*tcp.Transport)(nil)
