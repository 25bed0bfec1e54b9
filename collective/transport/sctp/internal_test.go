package sctp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

func testCfg() Config {
	cfg := DefaultConfig()
	cfg.Secret = []byte("test secret, not for production")
	cfg.HandshakeTimeout = 2 * time.Second
	cfg.IOTimeout = 20 * time.Second
	return cfg
}

// pairOf connects two transports and returns rank 0's and rank 1's links.
func pairOf(tb testing.TB, cfg Config) (*link, *link) {
	tb.Helper()
	trs := make([]*Transport, 2)
	for i := range trs {
		tr, err := Listen(cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		trs[i] = tr
	}
	a, b := conformance.ConnectPair(tb, trs[0], trs[1])
	return a.(*link), b.(*link)
}

// TestPeerVanishes: a peer whose socket disappears without a word (its
// process was killed) is noticed by the heartbeats a waiting read sends,
// long before the I/O timeout.
func TestPeerVanishes(t *testing.T) {
	cfg := testCfg()
	cfg.ProbeInterval = 100 * time.Millisecond
	a, b := pairOf(t, cfg)
	_ = b.c.udp.Close() // the kernel would do this for a killed process
	start := time.Now()
	var h transport.Header
	err := a.RecvHeader(context.Background(), &h)
	if !errors.Is(err, transport.ErrPeerClosed) {
		t.Fatalf("RecvHeader: %v, want ErrPeerClosed", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to notice", d)
	}
}

// TestBadMessages: messages that are not what the framing promises are a
// FrameError naming the peer, and the link stays broken.
func TestBadMessages(t *testing.T) {
	frame := func(length int, mutate func([]byte)) []byte {
		h := transport.Header{Kind: transport.FrameData, JobID: transport.JobHash("pair"), Epoch: 1, Sender: 0, Length: uint32(length)}
		b := make([]byte, transport.HeaderSize+min(length, messageBytes-transport.HeaderSize))
		h.Encode(b)
		if mutate != nil {
			mutate(b)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		msgs [][]byte
	}{
		{"short message", [][]byte{[]byte("tiny")}},
		{"bad magic", [][]byte{frame(4, func(b []byte) { b[0] = 'X' })}},
		{"other job", [][]byte{frame(4, func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 99) })}},
		{"other sender", [][]byte{frame(4, func(b []byte) { binary.LittleEndian.PutUint32(b[4:], 1) })}},
		{"first message too long", [][]byte{append(frame(4, nil), 1, 2, 3)}},
		{"first message too short", [][]byte{frame(4, nil)[:transport.HeaderSize+2]}},
		{"continuation too short", [][]byte{frame(messageBytes+10, nil), make([]byte, 5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pairOf(t, testCfg())
			for _, m := range tc.msgs {
				if _, err := a.c.stream.Write(m); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var h transport.Header
			err := b.RecvHeader(ctx, &h)
			if err == nil {
				err = b.RecvPayload(ctx, make([]byte, h.Length))
			}
			var fe *transport.FrameError
			if !errors.As(err, &fe) || fe.Peer != 0 {
				t.Fatalf("error %v is not a FrameError from rank 0", err)
			}
			if err := b.RecvHeader(ctx, &h); !errors.As(err, &fe) {
				t.Fatalf("second RecvHeader: %v, want the FrameError again", err)
			}
		})
	}
}

// TestStrangerDatagrams: garbage and connect requests that go nowhere, sent
// to the transports' ports, do not stop a world from connecting, and their
// handshakes end within the handshake timeout.
func TestStrangerDatagrams(t *testing.T) {
	cfg := testCfg()
	cfg.HandshakeTimeout = 300 * time.Millisecond
	tr, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c, err := net.Dial("udp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	junk := make([]byte, 300)
	rand.Read(junk)
	var req [requestSize]byte
	for i := range 20 {
		var nonce [nonceSize]byte
		nonce[0] = byte(i)
		encodeRequest(req[:], udpRequest, 0, &nonce)
		c.Write(req[:])
		c.Write(junk[:i*7])
	}
	// Requests are answered, then their handshakes time out.
	if err := waitFor(5*time.Second, tr.mesh.Idle); err != nil {
		t.Fatal("stranger handshakes still in progress")
	}
	a, b := pairOf(t, testCfg())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := transport.Header{Kind: transport.FrameData, Length: 3}
	if err := a.Send(ctx, &h, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := b.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		<-tick.C
	}
	return nil
}

// FuzzConnectDatagram: the connect datagram decoder never panics, and what it
// accepts re-encodes to the same bytes.
func FuzzConnectDatagram(f *testing.F) {
	var b [requestSize]byte
	var nonce [nonceSize]byte
	encodeRequest(b[:], udpRequest, 0, &nonce)
	f.Add(b[:])
	encodeRequest(b[:], udpReply, 4242, &nonce)
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, typ := range []uint8{udpRequest, udpReply} {
			var n [nonceSize]byte
			port, err := decodeRequest(in, typ, &n)
			if err != nil {
				continue
			}
			var out [requestSize]byte
			encodeRequest(out[:], typ, port, &n)
			if !bytes.Equal(out[:], in) {
				t.Fatalf("%x re-encodes as %x", in, out)
			}
		}
	})
}

// FuzzFirstMessage: checking a frame's first message never panics and
// accepts only a header of this world with the right amount of payload.
func FuzzFirstMessage(f *testing.F) {
	h := transport.Header{Kind: transport.FrameData, JobID: transport.JobHash("pair"), Epoch: 1, Length: 2}
	b := make([]byte, transport.HeaderSize+2)
	h.Encode(b)
	f.Add(b)
	l := &link{job: transport.JobHash("pair"), epoch: 1, unit: messageBytes}
	f.Fuzz(func(t *testing.T, msg []byte) {
		var h transport.Header
		if l.parseHeader(msg, &h) == nil && len(msg) != transport.HeaderSize+min(int(h.Length), messageBytes-transport.HeaderSize) {
			t.Fatalf("accepted a first message of %d bytes for a %d-byte frame", len(msg), h.Length)
		}
	})
}
