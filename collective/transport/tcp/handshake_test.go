package tcp_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// TestRawWrongSecret: a dialer whose proof does not verify hears "wrong
// secret", and does not spoil the world for the real rank.
func TestRawWrongSecret(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	a := listen(t, cfg)
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	connErr := make(chan error, 1)
	go func() {
		links, err := a.Connect(ctx, transport.World{JobID: "job", Epoch: 1, Rank: 0, Addrs: []string{a.Addr(), ""}})
		if err == nil {
			links[1].Close()
		}
		connErr <- err
	}()
	// The raw dialer checks the acceptor's proof with the right secret but proves
	// itself with a wrong one.
	_, err := dialRawWith(ctx, a.Addr(), testSecret, []byte("wrong"), "job", 1, 1, 0, 2)
	conformance.AsHandshakeError(t, err, 0, "wrong secret")
	// A right one may still come and does connect.
	p, err := dialRaw(ctx, a.Addr(), testSecret, "job", 1, 1, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	p.conn.Close()
	if err := <-connErr; err != nil {
		t.Fatal(err)
	}
}

// TestWrongRank: dialing a rank that is not the one listening there, or
// claiming a rank that should be dialed rather than dial, is refused.
func TestWrongRank(t *testing.T) {
	for _, tc := range []struct {
		name           string
		from, to, size int
		reason         string
	}{
		{"wrong acceptor", 2, 0, 3, "wrong rank"},
		{"lower rank dials", 0, 1, 3, "wrong rank"},
		{"world size", 2, 1, 4, "world mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			a := listen(t, testConfig())
			ctx := conformance.TimeoutCtx(t, 20*time.Second)
			connCtx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				// a is rank 1 of a 3-rank world.
				a.Connect(connCtx, transport.World{JobID: "job", Epoch: 1, Rank: 1, Addrs: []string{"127.0.0.1:1", a.Addr(), ""}})
			}()
			_, err := dialRaw(ctx, a.Addr(), testSecret, "job", 1, tc.from, tc.to, tc.size)
			cancel()
			<-done
			conformance.AsHandshakeError(t, err, tc.to, tc.reason)
		})
	}
}

// TestDuplicateReplaces: a rank that dials again while the world is still
// connecting replaces its earlier connection.
func TestDuplicateReplaces(t *testing.T) {
	checkNoLeaks(t)
	a := listen(t, testConfig())
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	var links []transport.Link
	connErr := make(chan error, 1)
	go func() {
		var err error
		links, err = a.Connect(ctx, transport.World{JobID: "job", Epoch: 1, Rank: 0, Addrs: []string{a.Addr(), "", ""}})
		connErr <- err
	}()
	first, err := dialRaw(ctx, a.Addr(), testSecret, "job", 1, 1, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer first.conn.Close()
	second, err := dialRaw(ctx, a.Addr(), testSecret, "job", 1, 1, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer second.conn.Close()
	third, err := dialRaw(ctx, a.Addr(), testSecret, "job", 1, 2, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer third.conn.Close()
	if err := <-connErr; err != nil {
		t.Fatal(err)
	}
	defer conformance.CloseAll([][]transport.Link{links})

	// The first connection was closed by the acceptor...
	first.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := first.conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("replaced connection: read = %v, want EOF", err)
	}
	// ...and the second one carries rank 1's frames.
	payload := []byte("hello from the second connection")
	if _, err := second.conn.Write(second.frame(transport.Header{Seq: 7, Step: 7, Length: uint32(len(payload))}, payload)); err != nil {
		t.Fatal(err)
	}
	if err := conformance.Recv(ctx, links[1], 7, payload); err != nil {
		t.Fatal(err)
	}
}
