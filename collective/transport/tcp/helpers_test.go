package tcp_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

var testSecret = []byte("test secret, not for production")

// sendAll sends payloads on l in the background, as frames of sequence
// numbers 1, 2, …, and reports on the channel the first failure, or nil
// once all are sent.
func sendAll(ctx context.Context, l transport.Link, payloads [][]byte) <-chan error {
	sent := make(chan error, 1)
	go func() {
		for i, p := range payloads {
			if err := conformance.Send(ctx, l, uint64(i+1), p); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	return sent
}

func testConfig() tcp.Config {
	cfg := tcp.DefaultConfig()
	cfg.Secret = testSecret
	cfg.HandshakeTimeout = 2 * time.Second
	cfg.IOTimeout = 20 * time.Second
	// The tests' ranks share this host, where the default would leave
	// frames plain: most tests are to run over sealed links (the
	// conformance suite and TestDefaultSecurity cover the other settings).
	cfg.Security = transport.SecurityAuthenticated
	// GOROVOD_TCP_DEBUG=1 go test -v shows the transports' own log.
	cfg.Logger = conformance.DebugLogger("GOROVOD_TCP_DEBUG")
	return cfg
}

// checkNoLeaks makes the test fail if, once its cleanups have run, goroutines of
// package tcp (or of the mesh code it runs on) are still alive. Register it
// first so it runs last.
func checkNoLeaks(t testing.TB) {
	t.Helper()
	conformance.CheckNoLeaks(t, tcpPackages...)
}

// tcpPackages are the packages whose goroutines a test of package tcp must
// not leave running (conformance.Factory.Packages).
var tcpPackages = []string{"collective/transport/tcp.", "collective/transport/internal/mesh."}

func listen(t testing.TB, cfg tcp.Config) *tcp.Transport {
	t.Helper()
	return conformance.Listen(t, tcp.Listen, cfg)
}

func listenN(t testing.TB, n int, cfg tcp.Config) []*tcp.Transport {
	t.Helper()
	trs := make([]*tcp.Transport, n)
	for i := range trs {
		trs[i] = listen(t, cfg)
	}
	return trs
}

// rawPeer plays one rank of a world by hand over a plain TCP connection, so a
// test controls every byte the transport under test receives.
type rawPeer struct {
	conn  net.Conn
	job   uint64
	epoch uint64
	rank  uint32
	// seal seals the frames it sends, as the link at the other end expects
	// (nil: plain frames).
	seal *framesec.Sealer
}

// rawSecurity is the setting a raw peer's hello names: testConfig's.
var rawSecurity = testConfig().Security

// dialRaw runs the dialer's side of the handshake as rank `from` of a world of
// size to the transport at addr (expected to be rank `to`), retrying while that
// transport is not connecting the world yet.
func dialRaw(ctx context.Context, addr string, secret []byte, job string, epoch uint64, from, to, size int) (*rawPeer, error) {
	return dialRawWith(ctx, addr, secret, secret, job, epoch, from, to, size)
}

// dialRawWith checks the acceptor's proof with checkSecret and proves itself
// with proveSecret.
func dialRawWith(ctx context.Context, addr string, checkSecret, proveSecret []byte, job string, epoch uint64, from, to, size int) (*rawPeer, error) {
	for {
		p, err := dialRawOnce(addr, checkSecret, proveSecret, job, epoch, from, to, size)
		var he *transport.HandshakeError
		if err == nil || (errors.As(err, &he) && he.Fatal) {
			return p, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: last attempt: %v", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func dialRawOnce(addr string, checkSecret, proveSecret []byte, job string, epoch uint64, from, to, size int) (*rawPeer, error) {
	hello := handshake.Hello{JobHash: transport.JobHash(job), Epoch: epoch, From: uint32(from), To: uint32(to), Size: uint32(size), Security: rawSecurity}
	rand.Read(hello.Nonce[:])
	p, _, err := dialRawHello(addr, checkSecret, proveSecret, hello)
	return p, err
}

// rawHandshake is what a raw peer's handshake exchanged: its hello as sent
// and the acceptor's nonce.
type rawHandshake struct {
	hello  [handshake.HelloSize]byte
	nonceA [handshake.NonceSize]byte
}

// dialRawHello runs the dialer's side of the handshake with hello, as it is.
func dialRawHello(addr string, checkSecret, proveSecret []byte, hello handshake.Hello) (*rawPeer, rawHandshake, error) {
	var hs rawHandshake
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, hs, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fail := func(err error) (*rawPeer, rawHandshake, error) {
		c.Close()
		return nil, hs, err
	}
	to, epoch, from := int(hello.To), hello.Epoch, hello.From
	var hb [handshake.HelloSize]byte
	hello.Encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return fail(err)
	}
	var cb [handshake.ChallengeSize]byte
	if _, err := io.ReadFull(c, cb[:]); err != nil {
		return fail(err)
	}
	var ch handshake.Challenge
	if err := handshake.DecodeChallenge(cb[:], &ch); err != nil {
		return fail(err)
	}
	if ch.Status != handshake.StatusOK {
		return fail(&transport.HandshakeError{Rank: to, Reason: ch.Status.String() + ": " + ch.Reason, Fatal: ch.Status.Fatal()})
	}
	want := handshake.AcceptorMAC(checkSecret, hb[:], &ch.Nonce)
	if !handshake.MACEqual(&want, &ch.MAC) {
		return fail(&transport.HandshakeError{Rank: to, Reason: "bad acceptor MAC", Fatal: true})
	}
	resp := handshake.Response{MAC: handshake.DialerMAC(proveSecret, hb[:], &ch.Nonce, &hello.Nonce)}
	var rb [handshake.ResponseSize]byte
	resp.Encode(rb[:])
	if _, err := c.Write(rb[:]); err != nil {
		return fail(err)
	}
	var vb [handshake.VerdictSize]byte
	if _, err := io.ReadFull(c, vb[:]); err != nil {
		return fail(err)
	}
	var v handshake.Verdict
	if err := handshake.DecodeVerdict(vb[:], &v); err != nil {
		return fail(err)
	}
	if v.Status != handshake.StatusOK {
		return fail(&transport.HandshakeError{Rank: to, Reason: v.Status.String() + ": " + v.Reason, Fatal: v.Status.Fatal()})
	}
	c.SetDeadline(time.Time{})
	hs.hello, hs.nonceA = hb, ch.Nonce
	p := &rawPeer{conn: c, job: hello.JobHash, epoch: epoch, rank: from}
	keys, err := framesec.Derive(hello.Security, proveSecret, hb[:], ch.Nonce[:], hello.Nonce[:], true)
	if err != nil {
		return fail(err)
	}
	if keys.Security != transport.SecurityPlain {
		if p.seal, err = framesec.NewSealer(keys.Security, keys.Send); err != nil {
			return fail(err)
		}
	}
	return p, hs, nil
}

// frame encodes a frame as this raw peer would send it.
func (p *rawPeer) frame(h transport.Header, payload []byte) []byte {
	return p.frameWith(h, payload, nil)
}

// frameWith is frame with the encoded header changed by mutate before it is
// sealed: a frame a peer that holds the keys got wrong.
func (p *rawPeer) frameWith(h transport.Header, payload []byte, mutate func(hdr []byte)) []byte {
	h.JobID, h.Epoch, h.Sender = p.job, p.epoch, p.rank
	if h.Kind == 0 {
		h.Kind = transport.FrameData
	}
	var hdr [transport.HeaderSize]byte
	h.Encode(hdr[:])
	if mutate != nil {
		mutate(hdr[:])
	}
	if p.seal == nil {
		return append(hdr[:], payload...)
	}
	b := p.seal.SealTo(make([]byte, framesec.WireSize(transport.SecurityAuthenticated, len(payload))), hdr[:])
	for off := 0; off < len(payload); off += framesec.SegmentSize {
		seg := payload[off:min(off+framesec.SegmentSize, len(payload))]
		b = append(b, p.seal.SealTo(make([]byte, len(seg)+framesec.TagSize), seg)...)
	}
	return b
}

// headerLen is how many bytes a frame's header takes on the wire.
func (p *rawPeer) headerLen() int {
	if p.seal == nil {
		return transport.HeaderSize
	}
	return transport.HeaderSize + framesec.TagSize
}

// rawWorld connects transport tr as rank 0 of a 2-rank world whose rank 1 is a
// raw peer, and returns tr's link to it and the raw peer.
func rawWorld(t testing.TB, tr *tcp.Transport, job string, epoch uint64) (transport.Link, *rawPeer) {
	t.Helper()
	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	var (
		links   []transport.Link
		connErr error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		links, connErr = tr.Connect(ctx, transport.World{JobID: job, Epoch: epoch, Rank: 0, Addrs: []string{tr.Addr(), ""}})
	}()
	p, err := dialRaw(ctx, tr.Addr(), testSecret, job, epoch, 1, 0, 2)
	<-done
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	if connErr != nil {
		t.Fatalf("Connect: %v", connErr)
	}
	t.Cleanup(func() {
		links[1].Close()
		p.conn.Close()
	})
	return links[1], p
}
