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

// TestSpoofedDatagrams: connect datagrams from a sender that cannot receive
// at the address it claims (spoofed) or that forge, reuse or outlive a
// cookie cost the transport no handshake slot and no socket; only the echo
// of a fresh cookie it made for that address and nonce does. Garbage is
// ignored, and a world still connects afterwards.
func TestSpoofedDatagrams(t *testing.T) {
	cfg := testCfg()
	cfg.HandshakeTimeout = 300 * time.Millisecond
	tr, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	dial := func() *net.UDPConn {
		raddr, err := net.ResolveUDPAddr("udp", tr.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c, other := dial(), dial()
	send := func(c *net.UDPConn, m connectMsg) {
		var b [datagramSize]byte
		m.encode(b[:])
		if _, err := c.Write(b[:]); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(c *net.UDPConn) connectMsg {
		t.Helper()
		var b [datagramSize + 1]byte
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(b[:])
		if err != nil {
			t.Fatal(err)
		}
		m, err := decodeConnect(b[:n])
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	// cookie asks for a cookie on c and returns it.
	cookie := func(c *net.UDPConn, nonce byte) connectMsg {
		t.Helper()
		send(c, connectMsg{typ: udpRequest, nonce: [nonceSize]byte{nonce}})
		m := recv(c)
		if m.typ != udpCookie || m.nonce != ([nonceSize]byte{nonce}) {
			t.Fatalf("answer to a request: %+v, want its cookie", m)
		}
		return m
	}
	// idle checks that no handshake was started for what was sent before:
	// the transport answers datagrams in order, so once the request sent
	// here has its cookie, everything earlier was handled.
	idle := func(what string) {
		t.Helper()
		cookie(c, 0xee)
		tr.mu.Lock()
		n := len(tr.requests)
		tr.mu.Unlock()
		if n != 0 || !tr.mesh.Idle() {
			t.Fatalf("%s: %d associations being set up, idle %v", what, n, tr.mesh.Idle())
		}
	}

	// Requests (what a spoofer sends, from any address) and garbage.
	junk := make([]byte, 300)
	rand.Read(junk)
	for i := range 20 {
		send(c, connectMsg{typ: udpRequest, nonce: [nonceSize]byte{byte(i)}})
		c.Write(junk[:i*7])
	}
	for range 20 {
		if m := recv(c); m.typ != udpCookie {
			t.Fatalf("answer to a request: %+v", m)
		}
	}
	idle("requests")

	real := cookie(c, 1)
	remote := c.LocalAddr().(*net.UDPAddr)
	at := uint32(time.Now().Unix())
	for _, tc := range []struct {
		name string
		from *net.UDPConn
		msg  connectMsg
	}{
		{"random cookie", c, connectMsg{typ: udpEcho, nonce: real.nonce, cookie: [cookieSize]byte{1, 2, 3}}},
		{"fresh timestamp, forged MAC", c, func() connectMsg {
			m := real
			m.typ = udpEcho
			m.cookie[15] ^= 1
			return m
		}()},
		{"real cookie, other nonce", c, connectMsg{typ: udpEcho, nonce: [nonceSize]byte{2}, cookie: real.cookie}},
		{"real cookie, other port", other, connectMsg{typ: udpEcho, nonce: real.nonce, cookie: real.cookie}},
		{"expired cookie", c, connectMsg{typ: udpEcho, nonce: real.nonce, cookie: tr.cookieFor(remote, &real.nonce, at-cookieLifetime-2)}},
		{"cookie from the future", c, connectMsg{typ: udpEcho, nonce: real.nonce, cookie: tr.cookieFor(remote, &real.nonce, at+60)}},
		{"a reply sent to the listener", c, connectMsg{typ: udpReply, port: 9, nonce: real.nonce}},
		{"a cookie sent to the listener", c, connectMsg{typ: udpCookie, nonce: real.nonce, cookie: real.cookie}},
	} {
		send(tc.from, tc.msg)
		idle(tc.name)
	}

	// The real echo starts an association: the reply names its socket.
	send(c, connectMsg{typ: udpEcho, nonce: real.nonce, cookie: real.cookie})
	if m := recv(c); m.typ != udpReply || m.port == 0 || m.nonce != real.nonce {
		t.Fatalf("answer to a valid echo: %+v, want a reply with a port", m)
	}
	// It is never continued, so its handshake times out.
	if err := waitFor(5*time.Second, tr.mesh.Idle); err != nil {
		t.Fatal("the echoed association is still being set up")
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
	for _, m := range []connectMsg{
		{typ: udpRequest, nonce: [nonceSize]byte{1}},
		{typ: udpCookie, nonce: [nonceSize]byte{1}, cookie: [cookieSize]byte{2}},
		{typ: udpEcho, nonce: [nonceSize]byte{1}, cookie: [cookieSize]byte{2}},
		{typ: udpReply, port: 4242, nonce: [nonceSize]byte{1}},
	} {
		var b [datagramSize]byte
		m.encode(b[:])
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := decodeConnect(in)
		if err != nil {
			return
		}
		var out [datagramSize]byte
		m.encode(out[:])
		if !bytes.Equal(out[:], in) {
			t.Fatalf("%x re-encodes as %x", in, out)
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
