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

// TestWrongSecret: in a pair with different secrets, the dialer fails at once
// with a fatal HandshakeError; the acceptor, which cannot tell a misconfigured
// peer from a stranger replaying a hello, keeps waiting, and when its context
// ends its error carries the HandshakeError of the rank that failed.
func TestWrongSecret(t *testing.T) {
	checkNoLeaks(t)
	cfgA, cfgB := testConfig(), testConfig()
	cfgB.Secret = []byte("another secret")
	a, b := listen(t, cfgA), listen(t, cfgB)
	addrs := []string{a.Addr(), b.Addr()}
	acceptErr := make(chan error, 1)
	go func() {
		_, err := a.Connect(conformance.TimeoutCtx(t, time.Second), transport.World{JobID: "job", Epoch: 1, Rank: 0, Addrs: addrs})
		acceptErr <- err
	}()
	start := time.Now()
	_, err := b.Connect(conformance.TimeoutCtx(t, 20*time.Second), transport.World{JobID: "job", Epoch: 1, Rank: 1, Addrs: addrs})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("wrong secret took %v to detect", d)
	}
	conformance.AsHandshakeError(t, err, 0, "wrong secret")
	err = <-acceptErr
	conformance.AsPeerError(t, err, 1, context.DeadlineExceeded)
	conformance.AsHandshakeError(t, err, 1, "wrong secret")
}

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

func TestWrongJob(t *testing.T) {
	checkNoLeaks(t)
	a, b := listen(t, testConfig()), listen(t, testConfig())
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	addrs := []string{a.Addr(), b.Addr()}
	connErr := make(chan error, 1)
	go func() {
		_, err := a.Connect(conformance.TimeoutCtx(t, time.Second), transport.World{JobID: "job-a", Epoch: 1, Rank: 0, Addrs: addrs})
		connErr <- err
	}()
	_, err := b.Connect(ctx, transport.World{JobID: "job-b", Epoch: 1, Rank: 1, Addrs: addrs})
	conformance.AsHandshakeError(t, err, 0, "wrong job")
	// Rank 0 never sees its rank 1 and says so when its context ends.
	conformance.AsPeerError(t, <-connErr, 1, context.DeadlineExceeded)
}

// TestStaleEpoch: a transport that has connected epoch 5 refuses a dial for
// epoch 4, and then connects epoch 6.
func TestStaleEpoch(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	conformance.CloseAll(conformance.ConnectAll(t, ctx, trs, "job", 5))

	late := listen(t, testConfig())
	_, err := late.Connect(ctx, transport.World{JobID: "job", Epoch: 4, Rank: 1, Addrs: []string{trs[0].Addr(), late.Addr()}})
	conformance.AsHandshakeError(t, err, 0, "stale epoch")

	_, err = dialRaw(ctx, trs[1].Addr(), testSecret, "job", 4, 2, 1, 3)
	conformance.AsHandshakeError(t, err, 1, "stale epoch")

	if err := conformance.Exchange(ctx, conformance.ConnectAll(t, ctx, trs, "job", 6), meshSizes); err != nil {
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

// TestConnectAfterClose and Close during Connect.
func TestCloseDuringConnect(t *testing.T) {
	checkNoLeaks(t)
	a := listen(t, testConfig())
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
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

// TestLinksOutliveTransport: closing the transport leaves returned links usable.
func TestLinksOutliveTransport(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	ctx := conformance.TimeoutCtx(t, 20*time.Second)
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	for _, tr := range trs {
		tr.Close()
	}
	if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
		t.Fatal(err)
	}
}
