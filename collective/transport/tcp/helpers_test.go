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
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

var testSecret = []byte("test secret, not for production")

func testConfig() tcp.Config {
	cfg := tcp.DefaultConfig()
	cfg.Secret = testSecret
	cfg.HandshakeTimeout = 2 * time.Second
	cfg.IOTimeout = 20 * time.Second
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
}

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
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fail := func(err error) (*rawPeer, error) {
		c.Close()
		return nil, err
	}
	hello := handshake.Hello{JobHash: transport.JobHash(job), Epoch: epoch, From: uint32(from), To: uint32(to), Size: uint32(size)}
	rand.Read(hello.Nonce[:])
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
	return &rawPeer{conn: c, job: hello.JobHash, epoch: epoch, rank: uint32(from)}, nil
}

// frame encodes a frame as this raw peer would send it.
func (p *rawPeer) frame(h transport.Header, payload []byte) []byte {
	h.JobID, h.Epoch, h.Sender = p.job, p.epoch, p.rank
	if h.Kind == 0 {
		h.Kind = transport.FrameData
	}
	b := make([]byte, transport.HeaderSize+len(payload))
	h.Encode(b)
	copy(b[transport.HeaderSize:], payload)
	return b
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
