package tcp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

var meshSizes = []int{0, 1, 4096, 1<<20 + 3}

// TestMeshLarge connects worlds of 5 to 8 ranks and exchanges frames between
// every pair: the conformance suite's Mesh covers worlds of 1 to 4.
func TestMeshLarge(t *testing.T) {
	for p := 5; p <= 8; p++ {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			checkNoLeaks(t)
			trs := listenN(t, p, testConfig())
			ctx := conformance.TimeoutCtx(t, 30*time.Second)
			links := conformance.ConnectAll(t, ctx, trs, "mesh", 1)
			for r, ls := range links {
				if len(ls) != p {
					t.Fatalf("rank %d: %d links, want %d", r, len(ls), p)
				}
				if ls[r] != nil {
					t.Fatalf("rank %d: link to itself is not nil", r)
				}
			}
			if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestListenConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*tcp.Config)
		ok     bool
	}{
		{"defaults", func(*tcp.Config) {}, true},
		{"no secret", func(c *tcp.Config) { c.Secret = nil }, false},
		{"bad address", func(c *tcp.Config) { c.ListenAddr = "256.0.0.1:x" }, false},
		{"socket buffer autotuned", func(c *tcp.Config) { c.SocketBuffer = -1 }, true},
		{"advertise", func(c *tcp.Config) { c.AdvertiseAddr = "worker-3:7000" }, true},
		{"socket buffer", func(c *tcp.Config) { c.SocketBuffer = 1 << 20 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			tc.mutate(&cfg)
			tr, err := tcp.Listen(cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("Listen: err = %v, want ok = %v", err, tc.ok)
			}
			if err != nil {
				return
			}
			defer tr.Close()
			if cfg.AdvertiseAddr != "" && tr.Addr() != cfg.AdvertiseAddr {
				t.Errorf("Addr() = %q, want %q", tr.Addr(), cfg.AdvertiseAddr)
			}
		})
	}
}

// TestWildcardAdvertise: transports bound to the wildcard address on any
// port advertise a host without a port, take their own port with it, and
// connect a world through those addresses.
func TestWildcardAdvertise(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.ListenAddr, cfg.AdvertiseAddr = "0.0.0.0:0", "127.0.0.1"
	trs := listenN(t, 3, cfg)
	for _, tr := range trs {
		if !strings.HasPrefix(tr.Addr(), "127.0.0.1:") || strings.HasSuffix(tr.Addr(), ":0") {
			t.Fatalf("Addr() = %q, want 127.0.0.1 and the bound port", tr.Addr())
		}
	}
	ctx := conformance.TimeoutCtx(t, 30*time.Second)
	if err := conformance.Exchange(ctx, conformance.ConnectAll(t, ctx, trs, "wildcard", 1), meshSizes); err != nil {
		t.Fatal(err)
	}
}

// TestSocketBufferMesh runs a mesh per socket buffer setting and checks the
// buffers every link's socket ended up with, on both the dialing and the
// accepting side: an explicit size; the default, which is 4 MiB where the
// kernel grants it and the host's ranks do not outnumber its CPUs, and the
// kernel's autotuning otherwise; and autotuning asked for.
func TestSocketBufferMesh(t *testing.T) {
	cpus := spin.HostCPUs()
	grants := tcp.KernelGrants(tcp.DefaultSocketBuffer)
	t.Logf("%d CPUs; kernel grants %d-byte socket buffers: %v", cpus, tcp.DefaultSocketBuffer, grants)
	// Linux reports twice the size it grants. Autotuning starts the receive
	// buffer at net.ipv4.tcp_rmem's middle value (128 KiB unless raised)
	// and may already have grown the send buffer to tcp_wmem's maximum.
	fixed := tcpBufs{atLeast: 2 * tcp.DefaultSocketBuffer}
	autotuned := tcpBufs{below: 2 * tcp.DefaultSocketBuffer, rcvOnly: true}
	def := autotuned
	if grants && cpus >= 2 {
		def = fixed
	}
	type bufCase struct {
		name  string
		size  int // Config.SocketBuffer
		ranks int
		want  tcpBufs
	}
	cases := []bufCase{
		{"explicit 64 KiB", 64 << 10, 3, tcpBufs{atLeast: 2 * 64 << 10, below: 2*64<<10 + 1}},
		{"default, a CPU per rank", 0, 2, def},
		{"autotuning", -1, 2, autotuned},
	}
	if cpus <= 8 {
		cases = append(cases, bufCase{"default, more ranks than CPUs", 0, cpus + 1, autotuned})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.SocketBuffer = tc.size
			cfg.ReadBufferSize = 16 << 10
			trs := listenN(t, tc.ranks, cfg)
			ctx := conformance.TimeoutCtx(t, 30*time.Second)
			links := conformance.ConnectAll(t, ctx, trs, "sockbuf", 1)
			for r, ls := range links {
				for _, l := range ls {
					if l == nil {
						continue
					}
					rcv, snd, err := tcp.SocketBuffers(l)
					if err != nil {
						t.Fatal(err)
					}
					if !tc.want.ok(rcv, snd) {
						t.Errorf("rank %d, link to %d: SO_RCVBUF %d, SO_SNDBUF %d; want %+v", r, l.Peer(), rcv, snd, tc.want)
					}
				}
			}
			if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// tcpBufs bounds what a socket's SO_RCVBUF and SO_SNDBUF report: at least
// atLeast, below below (0: no bound); rcvOnly bounds SO_RCVBUF alone.
type tcpBufs struct {
	atLeast, below int
	rcvOnly        bool
}

func (b tcpBufs) ok(rcv, snd int) bool {
	checked := []int{rcv, snd}
	if b.rcvOnly {
		checked = checked[:1]
	}
	for _, n := range checked {
		if n < b.atLeast || (b.below > 0 && n >= b.below) {
			return false
		}
	}
	return true
}

// TestConnectStaggered starts the ranks' Connect calls at different times, so
// dialers meet peers that are not listening for the world yet.
func TestConnectStaggered(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.HandshakeTimeout = 200 * time.Millisecond // parked dialers hear "not ready" quickly
	trs := listenN(t, 4, cfg)
	ctx := conformance.TimeoutCtx(t, 30*time.Second)
	addrs := conformance.AddrsOf(trs)
	links := make([][]transport.Link, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	// The highest ranks (the dialers) start first; the others follow 300ms apart,
	// longer than a parked connection waits.
	for i := len(trs) - 1; i >= 0; i-- {
		start := time.Duration(len(trs)-1-i) * 300 * time.Millisecond
		wg.Add(1)
		time.AfterFunc(start, func() {
			defer wg.Done()
			links[i], errs[i] = trs[i].Connect(ctx, transport.World{JobID: "stagger", Epoch: 1, Rank: i, Addrs: addrs})
		})
	}
	wg.Wait()
	t.Cleanup(func() { conformance.CloseAll(links) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if err := conformance.Exchange(ctx, links, meshSizes); err != nil {
		t.Fatal(err)
	}
}

// TestConnectMissingRanksSayWhy: the error of a Connect that gave up says why
// each missing rank is missing: a dial refused, a rank that never dialed in.
// The conformance suite's MissingRank checks that the ranks are named.
func TestConnectMissingRanksSayWhy(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 2, testConfig())
	// Ranks 0 and 3 are addresses nobody listens on (a closed transport's).
	gone := listen(t, testConfig())
	goneAddr := gone.Addr()
	gone.Close()
	addrs := []string{goneAddr, trs[0].Addr(), trs[1].Addr(), goneAddr}
	ctx := conformance.TimeoutCtx(t, 500*time.Millisecond)
	var wg sync.WaitGroup
	res := make([]error, 2)
	for i, tr := range trs {
		wg.Go(func() {
			_, res[i] = tr.Connect(ctx, transport.World{JobID: "missing", Epoch: 2, Rank: i + 1, Addrs: addrs})
		})
	}
	wg.Wait()
	// Rank 1 dials rank 0 (refused) and waits for rank 3 to dial it.
	pe := conformance.AsPeerError(t, res[0], 0, context.DeadlineExceeded)
	for _, want := range []string{"rank 3: never dialed in", "refused"} {
		if !strings.Contains(pe.Error(), want) {
			t.Errorf("rank 1's error %q does not mention %q", pe, want)
		}
	}
}

// TestChunkHint: a TCP transport's links suggest its chunk for oversubscribed
// worlds (transport.ChunkHinter), one whose worlds mix link kinds
// (MixedWorlds, as shared memory's bootstrap) suggests none: ranks that see
// different mixes of links must not choose different chunks.
func TestChunkHint(t *testing.T) {
	checkNoLeaks(t)
	for _, tc := range []struct {
		name  string
		mixed bool
		want  int
	}{
		{"tcp alone", false, tcp.OversubscribedChunk},
		{"mixed worlds", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			trs := listenN(t, 3, testConfig())
			if tc.mixed {
				for _, tr := range trs {
					tr.MixedWorlds()
				}
			}
			links := conformance.ConnectAll(t, conformance.TimeoutCtx(t, 20*time.Second), trs, "chunk-hint-"+strings.ReplaceAll(tc.name, " ", "-"), 1)
			defer conformance.CloseAll(links)
			for r := range links {
				for p, l := range links[r] {
					if l == nil {
						continue
					}
					if got := l.(transport.ChunkHinter).OversubscribedChunkBytes(); got != tc.want {
						t.Errorf("link %d→%d suggests %d bytes, want %d", r, p, got, tc.want)
					}
				}
			}
		})
	}
}

// TestOversubscribedWorld: when a world has more ranks on this host than the
// host has CPUs, its links' polls also yield to other processes; otherwise
// they do not.
func TestOversubscribedWorld(t *testing.T) {
	checkNoLeaks(t)
	cpus := spin.HostCPUs()
	sizes := []int{2, cpus + 1}
	if cpus+1 > 16 {
		sizes = sizes[:1] // a world larger than the host's CPUs would be too big a test here
	}
	for _, n := range sizes {
		trs := listenN(t, n, testConfig())
		links := conformance.ConnectAll(t, conformance.TimeoutCtx(t, 20*time.Second), trs, fmt.Sprintf("oversubscribed-%d", n), 1)
		for r := range links {
			for p, l := range links[r] {
				if l == nil {
					continue
				}
				if got, want := tcp.YieldsToProcesses(l), n > cpus; got != want {
					t.Errorf("world of %d on %d CPUs: link %d→%d yields to processes: %v, want %v", n, cpus, r, p, got, want)
				}
			}
		}
		conformance.CloseAll(links)
	}
}
