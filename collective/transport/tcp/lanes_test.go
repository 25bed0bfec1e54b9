package tcp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// TestLanesConnect: a link has Config.Lanes connections, one by default
// between ranks of this host, and ranks whose settings differ do not
// connect.
func TestLanesConnect(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lanes     [2]int
		want      int
		mismatch  bool
		frameSize int
	}{
		{"default on one host", [2]int{0, 0}, 1, false, 1 << 20},
		{"one", [2]int{1, 1}, 1, false, 1 << 20},
		{"three", [2]int{3, 3}, 3, false, 1<<20 + 17},
		{"sixteen", [2]int{16, 16}, 16, false, 5<<20 + 3},
		{"settings differ", [2]int{2, 4}, 0, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			trs := make([]*tcp.Transport, 2)
			for r := range trs {
				cfg := testConfig()
				cfg.Lanes = tc.lanes[r]
				cfg.HandshakeTimeout = time.Second
				trs[r] = listen(t, cfg)
			}
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			addrs := []string{trs[0].Addr(), trs[1].Addr()}
			links := make([][]transport.Link, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r, tr := range trs {
				wg.Go(func() {
					cctx := ctx
					if tc.mismatch && r == 0 {
						// The acceptor waits for a dialer it refuses.
						var cancel context.CancelFunc
						cctx, cancel = context.WithTimeout(ctx, 2*time.Second)
						defer cancel()
					}
					links[r], errs[r] = tr.Connect(cctx, transport.World{JobID: "job", Epoch: 1, Rank: r, Addrs: addrs})
				})
			}
			wg.Wait()
			t.Cleanup(func() { conformance.CloseAll(links) })
			if tc.mismatch {
				var he *transport.HandshakeError
				if !errors.As(errs[1], &he) || !strings.Contains(he.Reason, "lanes") {
					t.Fatalf("dialer with other lanes: Connect = %v, want a HandshakeError about lanes", errs[1])
				}
				return
			}
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: Connect: %v", r, err)
				}
			}
			for r := range 2 {
				if got := tcp.Lanes(links[r][1-r]); got != tc.want {
					t.Fatalf("rank %d's link has %d lanes, want %d", r, got, tc.want)
				}
			}
			// Frames of every size cross intact, in order, both ways at once.
			sizes := []int{0, 1, 2*tcp.StripeMin - 1, 2 * tcp.StripeMin, tc.frameSize, 100}
			if err := conformance.Exchange(ctx, links, sizes); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLanesRule: Config.Lanes when set; else one lane to a peer on this
// host and tcp.AutoLanes to a peer on another.
func TestLanesRule(t *testing.T) {
	for _, tc := range []struct {
		configured int
		sameHost   bool
		want       int
	}{
		{0, true, 1},
		{0, false, tcp.AutoLanes},
		{1, false, 1},
		{4, true, 4},
		{4, false, 4},
	} {
		if got := tcp.LanesFor(tc.configured, tc.sameHost); got != tc.want {
			t.Errorf("LanesFor(%d, same host %v) = %d, want %d", tc.configured, tc.sameHost, got, tc.want)
		}
	}
}

// TestLaneHandshake: a connection that claims to be a further lane of a
// link joins it only if the acceptor can tie it to that link's first
// connection; a lane of an old epoch, before its first, with the wrong
// tie or from a stranger is refused, and the link is made only once all
// its lanes are in.
func TestLaneHandshake(t *testing.T) {
	const job = "job"
	for _, tc := range []struct {
		name string
		// lane1 changes lane 1's hello (its nonce already the tie to lane 0).
		lane1      func(h *handshake.Hello)
		secret     []byte // lane 1 proves this secret
		skipFirst  bool   // lane 1 comes without a first lane
		wantStatus string // "" accepted
	}{
		{"tied to its first", func(h *handshake.Hello) {}, testSecret, false, ""},
		{"wrong tie", func(h *handshake.Hello) { h.Nonce[0] ^= 1 }, testSecret, false, "lane of a link this side does not have"},
		{"other lane count", func(h *handshake.Hello) { h.Lane = 1; h.Lanes = 3 }, testSecret, false, "lanes per link"},
		{"old epoch", func(h *handshake.Hello) { h.Epoch = 1 }, testSecret, false, "stale epoch"},
		{"no first", func(h *handshake.Hello) {}, testSecret, true, "lane of a link this side does not have"},
		{"stranger", func(h *handshake.Hello) {}, []byte("another secret"), false, "wrong secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Lanes = 2
			tr := listen(t, cfg)
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			// An older world of the job connected here first, so its epoch
			// is stale from now on.
			older, _ := rawWorldLanes(t, ctx, tr, job, 1)
			older.Close()

			connected := make(chan error, 1)
			var links []transport.Link
			go func() {
				var err error
				links, err = tr.Connect(ctx, transport.World{JobID: job, Epoch: 2, Rank: 0, Addrs: []string{tr.Addr(), ""}})
				connected <- err
			}()
			t.Cleanup(func() {
				for _, l := range links {
					if l != nil {
						l.Close()
					}
				}
			})
			hello := handshake.Hello{JobHash: transport.JobHash(job), Epoch: 2, From: 1, To: 0, Size: 2, Security: rawSecurity, Lanes: 2}
			rand.Read(hello.Nonce[:])
			var first rawHandshake
			if !tc.skipFirst {
				p0, hs, err := dialRawRetry(ctx, tr.Addr(), testSecret, hello)
				if err != nil {
					t.Fatalf("first lane: %v", err)
				}
				defer p0.conn.Close()
				first = hs
			}
			h1 := hello
			h1.Lane = 1
			h1.Nonce = handshake.LaneNonce(testSecret, first.hello[:], &first.nonceA, 1)
			tc.lane1(&h1)
			p1, _, err := dialRawHello(tr.Addr(), testSecret, tc.secret, h1)
			if tc.wantStatus == "" {
				if err != nil {
					t.Fatalf("lane 1 refused: %v", err)
				}
				defer p1.conn.Close()
				if err := <-connected; err != nil {
					t.Fatalf("Connect: %v", err)
				}
				if got := tcp.Lanes(links[1]); got != 2 {
					t.Fatalf("link has %d lanes, want 2", got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantStatus) {
				t.Fatalf("lane 1: %v, want a refusal mentioning %q", err, tc.wantStatus)
			}
			// The link never forms on the first lane alone.
			select {
			case err := <-connected:
				t.Fatalf("Connect returned (%v) without the link's second lane", err)
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
}

// dialRawRetry is dialRawHello, retried while the acceptor is not
// connecting the world yet.
func dialRawRetry(ctx context.Context, addr string, secret []byte, hello handshake.Hello) (*rawPeer, rawHandshake, error) {
	for {
		p, hs, err := dialRawHello(addr, secret, secret, hello)
		var he *transport.HandshakeError
		if err == nil || (errors.As(err, &he) && he.Fatal) {
			return p, hs, err
		}
		select {
		case <-ctx.Done():
			return nil, hs, fmt.Errorf("%w: last attempt: %v", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// rawWorldLanes connects tr as rank 0 of a 2-rank world whose rank 1 is a
// raw peer with tr's two lanes, and returns tr's link and the raw lanes.
func rawWorldLanes(t *testing.T, ctx context.Context, tr *tcp.Transport, job string, epoch uint64) (transport.Link, []*rawPeer) {
	t.Helper()
	done := make(chan error, 1)
	var links []transport.Link
	go func() {
		var err error
		links, err = tr.Connect(ctx, transport.World{JobID: job, Epoch: epoch, Rank: 0, Addrs: []string{tr.Addr(), ""}})
		done <- err
	}()
	hello := handshake.Hello{JobHash: transport.JobHash(job), Epoch: epoch, From: 1, To: 0, Size: 2, Security: rawSecurity, Lanes: 2}
	rand.Read(hello.Nonce[:])
	p0, hs, err := dialRawRetry(ctx, tr.Addr(), testSecret, hello)
	if err != nil {
		t.Fatalf("first lane: %v", err)
	}
	h1 := hello
	h1.Lane = 1
	h1.Nonce = handshake.LaneNonce(testSecret, hs.hello[:], &hs.nonceA, 1)
	p1, _, err := dialRawHello(tr.Addr(), testSecret, testSecret, h1)
	if err != nil {
		t.Fatalf("second lane: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() {
		links[1].Close()
		p0.conn.Close()
		p1.conn.Close()
	})
	return links[1], []*rawPeer{p0, p1}
}

// TestTamperedLane: a bit changed on one lane of a sealed link, in a
// stripe of a large frame, makes the receiver fail with a broken-link
// error naming the sender that wraps ErrFrameAuth, and the whole link
// stays broken; a lane cut mid-frame fails the link with a typed peer
// error within bounded time. Each lane has keys of its own, so a stripe
// is verified on the lane it came by.
func TestTamperedLane(t *testing.T) {
	const (
		lanes    = 4
		smallLen = 1000
		largeLen = 1 << 20 // four stripes of 256 KiB, one segment each
	)
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		stripeWire := framesec.WireSize(sec, largeLen/lanes) - transport.HeaderSize - framesec.TagSize
		for _, tc := range []struct {
			name   string
			lane   int // the tampered lane's connection (its place among the accepted)
			at     int // the byte changed in what that lane carries after the handshake
			cut    bool
			wantIs error
		}{
			{"first lane's stripe", 0, framesec.WireSize(sec, smallLen) + transport.HeaderSize + framesec.TagSize + 5000, false, transport.ErrFrameAuth},
			{"second lane's stripe", 1, 77, false, transport.ErrFrameAuth},
			{"last lane's tag", lanes - 1, stripeWire - 1, false, transport.ErrFrameAuth},
			{"third lane cut", 2, 100, true, transport.ErrPeerClosed},
		} {
			t.Run(sec.String()+"/"+tc.name, func(t *testing.T) {
				checkNoLeaks(t)
				cfg := testConfig()
				cfg.Security = sec
				cfg.Lanes = lanes
				trs := listenN(t, 2, cfg)
				edit := func(b []byte) []byte { b[tc.at] ^= 0x04; return b }
				if tc.cut {
					edit = nil
				}
				proxy := newLaneTamperProxy(t, trs[0].Addr(), tc.at+1, edit, tc.lane)
				ctx := conformance.TimeoutCtx(t, 20*time.Second)
				links := connectVia(t, ctx, trs, proxy.addr())
				recv, send := links[0][1], links[1][0]

				payloads := [][]byte{conformance.Pattern(smallLen, 1, 0, 1), conformance.Pattern(largeLen, 1, 0, 2)}
				sent := sendAll(ctx, send, payloads)
				var failure error
				for i, want := range payloads {
					var h transport.Header
					if failure = recv.RecvHeader(ctx, &h); failure != nil {
						break
					}
					got := make([]byte, h.Length)
					if failure = recv.RecvPayload(ctx, got); failure != nil {
						if i != 1 {
							t.Fatalf("frame %d failed (%v); only the striped frame was tampered with", i, failure)
						}
						break
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("frame %d: a changed payload was delivered", i)
					}
				}
				if failure == nil {
					t.Fatal("a tampered stripe was delivered")
				}
				conformance.AsPeerError(t, failure, 1, tc.wantIs)
				// The link stays broken, on every lane.
				var h transport.Header
				if err := recv.RecvHeader(ctx, &h); !errors.Is(err, tc.wantIs) {
					t.Fatalf("RecvHeader after the failure: %v, want the same error", err)
				}
				recv.Close()
				send.Close()
				<-sent
			})
		}
	}
}

// TestLanesHandshakeAtOnce: a link's further lanes handshake at the same
// time, after its first: a path that holds each further lane's hello until
// the hellos of all of them have come lets the link connect only when the
// dialer opens them together. A dialer that handshakes them one after
// another never sends lane 2's hello (it waits for lane 1's answer), and
// its Connect runs into the deadline.
func TestLanesHandshakeAtOnce(t *testing.T) {
	const lanes = 4
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.Lanes = lanes
	trs := listenN(t, 2, cfg)
	var (
		mu sync.Mutex
		// held: the further lanes whose hellos the path has, by lane. By
		// lane, not counted: a dialer whose lane 1 times out dials the
		// link again and sends another lane 1.
		held    = make(map[uint8]bool)
		allHere = make(chan struct{})
		stop    = make(chan struct{})
	)
	proxy := newPathProxy(t, trs[0].Addr(), func(client, server net.Conn) {
		hello := make([]byte, handshake.HelloSize)
		if _, err := io.ReadFull(client, hello); err != nil {
			return
		}
		var h handshake.Hello
		if handshake.DecodeHello(hello, &h) == nil && h.Lane > 0 {
			mu.Lock()
			if !held[h.Lane] {
				if held[h.Lane] = true; len(held) == lanes-1 {
					close(allHere)
				}
			}
			mu.Unlock()
			select {
			case <-allHere:
			case <-stop:
				return
			}
		}
		if _, err := server.Write(hello); err != nil {
			return
		}
		io.Copy(server, client)
	})
	// Runs before the proxy's own cleanup, which waits for its goroutines.
	t.Cleanup(func() { close(stop) })

	ctx := conformance.TimeoutCtx(t, 10*time.Second)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	links := make([][]transport.Link, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, tr := range trs {
		// Rank 1 dials rank 0 through the path.
		addrs := []string{trs[0].Addr(), trs[1].Addr()}
		if r == 1 {
			addrs[0] = proxy.addr()
		}
		wg.Go(func() {
			links[r], errs[r] = tr.Connect(cctx, transport.World{JobID: "job", Epoch: 1, Rank: r, Addrs: addrs})
		})
	}
	wg.Wait()
	t.Cleanup(func() { conformance.CloseAll(links) })
	mu.Lock()
	got := len(held)
	mu.Unlock()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Connect: %v (the path had the hellos of %d of the %d further lanes)", r, err, got, lanes-1)
		}
	}
	if n := tcp.Lanes(links[1][0]); n != lanes {
		t.Fatalf("link has %d lanes, want %d", n, lanes)
	}
	if err := conformance.Exchange(ctx, links, []int{0, 1, 2*tcp.StripeMin + 1}); err != nil {
		t.Fatal(err)
	}
}
