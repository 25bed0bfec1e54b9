package tcp_test

import (
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

// TestPeerSilentMidPayload: a peer that falls silent halfway through a
// frame's payload fails RecvPayload with ErrPeerTimeout after IOTimeout.
// The conformance suite's IOTimeout covers a silent peer between frames
// (RecvHeader) and one that reads nothing (Send); only a raw peer can stop
// inside a frame.
func TestPeerSilentMidPayload(t *testing.T) {
	checkNoLeaks(t)
	const ioTimeout = 200 * time.Millisecond
	cfg := testConfig()
	cfg.IOTimeout = ioTimeout
	l, p := rawWorld(t, listen(t, cfg), "job", 1)
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	p.conn.Write(p.frame(transport.Header{Length: 1000}, make([]byte, 1000))[:p.headerLen()+10])
	start := time.Now()
	var h transport.Header
	err := l.RecvHeader(ctx, &h)
	if err == nil {
		err = l.RecvPayload(ctx, make([]byte, h.Length))
	}
	elapsed := time.Since(start)
	conformance.AsPeerError(t, err, 1, transport.ErrPeerTimeout)
	if elapsed < ioTimeout*3/4 || elapsed > 10*ioTimeout {
		t.Errorf("timed out after %v, IOTimeout is %v", elapsed, ioTimeout)
	}
}

// TestSlowPeerIsNotSilent: a payload that trickles in over several I/O timeouts
// still arrives, because the timeout bounds silence, not the transfer. The
// conformance suite's SlowReceiverIsNotSilent checks the sending side; only a
// raw peer can trickle the bytes of one frame to the receiving side.
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

// Compile-time check that the exported type is a transport.Transport.
var _ transport.Transport = (*tcp.Transport)(nil)
