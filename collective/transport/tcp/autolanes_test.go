package tcp_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/framesec"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// twoHosts connects a 2-rank world whose ranks look like two hosts to
// each other: rank 0 listens on 127.0.0.2 and rank 1 dials it from
// 127.0.0.1, so the ends of every connection have different addresses.
func twoHosts(t *testing.T, ctx context.Context, cfg tcp.Config) [][]transport.Link {
	t.Helper()
	trs := make([]*tcp.Transport, 2)
	for r, addr := range []string{"127.0.0.2:0", "127.0.0.1:0"} {
		c := cfg
		c.ListenAddr = addr
		trs[r] = listen(t, c)
	}
	links := conformance.ConnectAll(t, ctx, trs, "job", 1)
	t.Cleanup(func() { conformance.CloseAll(links) })
	return links
}

// TestAutoLanes: with Config.Lanes 0 a link between hosts opens
// tcp.AutoLanes connections and each direction's sender settles on a
// count of its own, announced to the receiver, while frames of every size
// cross intact both ways, from several goroutines at once; an explicit
// count is used as it is, never changed.
func TestAutoLanes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lanes    int
		security transport.Security
		want     int  // connections per link
		auto     bool // the senders choose
	}{
		{"auto, authenticated", 0, transport.SecurityAuthenticated, tcp.AutoLanes, true},
		{"auto, encrypted", 0, transport.SecurityEncrypted, tcp.AutoLanes, true},
		{"auto, plain", 0, transport.SecurityPlain, tcp.AutoLanes, true},
		{"forced 3", 3, transport.SecurityAuthenticated, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Lanes = tc.lanes
			cfg.Security = tc.security
			ctx := conformance.TimeoutCtx(t, 60*time.Second)
			links := twoHosts(t, ctx, cfg)
			pair := []transport.Link{links[0][1], links[1][0]}
			for r, l := range pair {
				if got := tcp.Lanes(l); got != tc.want {
					t.Fatalf("rank %d's link has %d connections, want %d", r, got, tc.want)
				}
				if tc.auto {
					tcp.SetLaneTrial(l, 256<<10, 1<<20)
					tcp.CountPauses(l)
				}
			}
			// Several senders per direction, sizes around the striping
			// threshold and past it, until both senders have chosen.
			sizes := []int{10, 2*tcp.StripeMin - 1, 2 * tcp.StripeMin, 100 << 10, 300<<10 + 7, 1 << 20}
			for round := 0; ; round++ {
				if err := exchangeConcurrently(ctx, pair, 3, 8, sizes); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				s0, _, _ := tcp.LanesChosen(pair[0])
				s1, _, _ := tcp.LanesChosen(pair[1])
				if !tc.auto || (s0 && s1) {
					// One more round: a sender announces the count it
					// settled on with its next large frame.
					if err := exchangeConcurrently(ctx, pair, 3, 8, sizes); err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					break
				}
				if round == 100 {
					t.Fatal("the senders did not settle within 100 rounds")
				}
			}
			for r, l := range pair {
				settled, chosen, rates := tcp.LanesChosen(l)
				if settled != tc.auto {
					t.Errorf("rank %d: settled %v, want %v", r, settled, tc.auto)
				}
				want := tc.want
				if tc.auto {
					want = chosen
					t.Logf("rank %d sends over %d lanes (MB/s by count: %.0f)", r, chosen, mbps(rates))
				}
				if got := tcp.SendLanes(l); got != want {
					t.Errorf("rank %d sends over %d lanes, want %d", r, got, want)
				}
				// The peer was told.
				if got := tcp.RecvLanes(pair[1-r]); got != want {
					t.Errorf("rank %d's peer expects %d lanes, rank %d sends over %d", 1-r, got, r, want)
				}
			}
		})
	}
}

func mbps(rates []float64) []float64 {
	out := make([]float64, len(rates))
	for i, r := range rates {
		out[i] = r / 1e6
	}
	return out
}

// exchangeConcurrently has each end of a link send frames of sizes from
// senders goroutines at once, frames each, while the other end receives
// and checks every frame: each sender's frames in order and intact.
func exchangeConcurrently(ctx context.Context, pair []transport.Link, senders, frames int, sizes []int) error {
	var wg sync.WaitGroup
	errc := make(chan error, 2*(senders+1))
	for r, l := range pair {
		for sn := range senders {
			wg.Go(func() {
				for i := range frames {
					n := sizes[(sn+i)%len(sizes)]
					h := transport.Header{Kind: transport.FrameData, Seq: uint64(sn), Step: uint32(i), Length: uint32(n)}
					if err := l.Send(ctx, &h, conformance.Pattern(n, r, sn, i)); err != nil {
						errc <- fmt.Errorf("rank %d sender %d frame %d: %w", r, sn, i, err)
						return
					}
				}
			})
		}
		peer := pair[1-r]
		wg.Go(func() {
			next := make([]int, senders)
			for range senders * frames {
				var h transport.Header
				if err := peer.RecvHeader(ctx, &h); err != nil {
					errc <- fmt.Errorf("rank %d receiving: %w", 1-r, err)
					return
				}
				sn, i := int(h.Seq), int(h.Step)
				if h.Kind != transport.FrameData || sn >= senders || i != next[sn] {
					errc <- fmt.Errorf("rank %d: frame %d of sender %d (kind %v) out of order", 1-r, i, sn, h.Kind)
					return
				}
				next[sn]++
				buf := make([]byte, h.Length)
				if err := peer.RecvPayload(ctx, buf); err != nil {
					errc <- fmt.Errorf("rank %d receiving: %w", 1-r, err)
					return
				}
				if !bytes.Equal(buf, conformance.Pattern(len(buf), r, sn, i)) {
					errc <- fmt.Errorf("rank %d: frame %d of sender %d (%d bytes) corrupted", 1-r, i, sn, len(buf))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// TestLaneCountChanges: whatever count a sender moves to, and however
// often, the receiver cuts every frame as the sender did, on plain,
// authenticated and encrypted links, both ways at once.
func TestLaneCountChanges(t *testing.T) {
	counts := []int{1, 4, 2, 3, 1, 1, 4, 2}
	sizes := []int{0, 2*tcp.StripeMin - 1, 2 * tcp.StripeMin, 3*tcp.StripeMin + 5, 1<<20 + 17, 100}
	for _, sec := range []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Lanes = 4
			cfg.Security = sec
			trs := listenN(t, 2, cfg)
			ctx := conformance.TimeoutCtx(t, 30*time.Second)
			links := conformance.ConnectAll(t, ctx, trs, "job", 1)
			t.Cleanup(func() { conformance.CloseAll(links) })
			for step, n := range counts {
				// The two directions use different counts.
				m := counts[(step+3)%len(counts)]
				tcp.SetSendLanes(links[0][1], n)
				tcp.SetSendLanes(links[1][0], m)
				if err := conformance.Exchange(ctx, links, sizes); err != nil {
					t.Fatalf("step %d (%d and %d lanes): %v", step, n, m, err)
				}
				if got := tcp.RecvLanes(links[1][0]); got != n {
					t.Errorf("step %d: rank 1 expects %d lanes, rank 0 sends over %d", step, got, n)
				}
				if got := tcp.RecvLanes(links[0][1]); got != m {
					t.Errorf("step %d: rank 0 expects %d lanes, rank 1 sends over %d", step, got, m)
				}
			}
		})
	}
}

// TestAutoLanesPaced: where each connection is bound on its own (paced by
// TCP to a fixed rate, as one stream is by a core or its congestion
// window), the sender measures one lane, then two, then four, and keeps
// four.
func TestAutoLanesPaced(t *testing.T) {
	checkNoLeaks(t)
	const pace = 16 << 20 // bytes per second per connection
	cfg := testConfig()
	cfg.Security = transport.SecurityPlain
	// Small socket buffers, so that the frames measured wait for the
	// pacing rather than fill the buffers.
	cfg.SocketBuffer = 64 << 10
	ctx := conformance.TimeoutCtx(t, 60*time.Second)
	links := twoHosts(t, ctx, cfg)
	send, recv := links[1][0], links[0][1]
	if err := tcp.PaceLanes(send, pace); err != nil {
		t.Skipf("SO_MAX_PACING_RATE: %v", err)
	}
	// At 4 MiB a trial, the four-lane one takes about 60 ms: a stall of
	// the loaded machine's scheduler must last 50 ms to bring its rate
	// under two lanes'.
	tcp.SetLaneTrial(send, 512<<10, 4<<20)
	payload := conformance.Pattern(256<<10, 1, 0, 0)
	got := make([]byte, len(payload))
	errc := make(chan error, 1)
	go func() {
		// Frames until the sender has chosen, then an empty one that
		// says so. (Only the sender asks the chooser: it holds the lock
		// that guards it while a frame waits for the pacing.)
		for i := 0; ; i++ {
			if settled, _, _ := tcp.LanesChosen(send); settled || i == 200 {
				errc <- conformance.Send(ctx, send, uint64(i), nil)
				return
			}
			if err := conformance.Send(ctx, send, uint64(i), payload); err != nil {
				errc <- err
				return
			}
		}
	}()
	for i := 0; ; i++ {
		var h transport.Header
		if err := recv.RecvHeader(ctx, &h); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h.Length == 0 {
			break
		}
		if err := recv.RecvPayload(ctx, got); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	settled, chosen, rates := tcp.LanesChosen(send)
	if !settled {
		t.Fatalf("the sender did not settle within 200 frames (MB/s by count: %.1f)", mbps(rates))
	}
	t.Logf("rates by lanes (MB/s): 1: %.1f, 2: %.1f, 4: %.1f", rates[1]/1e6, rates[2]/1e6, rates[4]/1e6)
	if chosen != 4 {
		t.Fatalf("chose %d lanes over connections paced each at %d MB/s, want 4 (MB/s by count: %.1f)", chosen, pace>>20, mbps(rates))
	}
}

// TestLanesFrame: a peer's FrameLanes sets how the frames after it are cut
// (here by a peer written by hand, which stripes a frame over one lane and
// then over two); one that names no lanes, more lanes than the link has,
// or carries a payload breaks the link with an error naming the peer.
func TestLanesFrame(t *testing.T) {
	const size = 1 << 20
	payload := conformance.Pattern(size, 1, 0, 0)
	for _, tc := range []struct {
		name    string
		aux     uint32
		length  uint32
		wantErr string
	}{
		{"one lane", 1, 0, ""},
		{"two lanes", 2, 0, ""},
		{"no lanes", 0, 0, "lanes frame"},
		{"more lanes than the link has", 3, 0, "lanes frame for 3 lanes"},
		{"with a payload", 2, 8, "lanes frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Lanes = 2
			tr := listen(t, cfg)
			ctx := conformance.TimeoutCtx(t, 10*time.Second)
			l, peers := rawWorldLanes(t, ctx, tr, "job", 1)
			lanesFrame := peers[0].frame(transport.Header{Kind: transport.FrameLanes, Aux: tc.aux, Length: tc.length}, make([]byte, tc.length))
			if _, err := peers[0].conn.Write(lanesFrame); err != nil {
				t.Fatal(err)
			}
			// The data frame, cut over tc.aux lanes: the header and the
			// first stripe on the first lane, the second stripe (if any)
			// alone on the second.
			hdr := transport.Header{Kind: transport.FrameData, Seq: 9, Length: size}
			var wire [][]byte
			if tc.aux == 2 {
				q := (size / 2) &^ 63
				wire = [][]byte{peers[0].frame(hdr, payload[:q]), sealStripe(peers[1], payload[q:])}
			} else {
				// (Sealing advances the raw peer's counters: seal only
				// what is sent.)
				wire = [][]byte{peers[0].frame(hdr, payload)}
			}
			var writers sync.WaitGroup
			defer writers.Wait()
			for k, b := range wire {
				writers.Go(func() { _, _ = peers[k].conn.Write(b) })
			}
			defer func() {
				for _, p := range peers {
					p.conn.Close()
				}
			}()
			var h transport.Header
			err := l.RecvHeader(ctx, &h)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("RecvHeader after a lanes frame for %d lanes of %d bytes: %+v, want an error", tc.aux, tc.length, h)
				}
				conformance.AsPeerError(t, err, 1, nil)
				if !bytes.Contains([]byte(err.Error()), []byte(tc.wantErr)) {
					t.Errorf("error %q does not mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Kind != transport.FrameData || h.Seq != 9 || h.Length != size {
				t.Fatalf("got %+v, want the data frame after the lanes frame", h)
			}
			got := make([]byte, size)
			if err := l.RecvPayload(ctx, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, payload) {
				t.Fatal("payload cut over the announced lanes differs")
			}
			if n := tcp.RecvLanes(l); n != int(tc.aux) {
				t.Errorf("link expects %d lanes, the peer announced %d", n, tc.aux)
			}
		})
	}
}

// sealStripe is a stripe as a raw peer sends it on a lane past the first:
// its segments, each sealed with that lane's keys, without a header.
func sealStripe(p *rawPeer, stripe []byte) []byte {
	if p.seal == nil {
		return stripe
	}
	var b []byte
	for off := 0; off < len(stripe); off += framesec.SegmentSize {
		seg := stripe[off:min(off+framesec.SegmentSize, len(stripe))]
		b = append(b, p.seal.SealTo(make([]byte, len(seg)+framesec.TagSize), seg)...)
	}
	return b
}

// TestLanesZeroAllocs: a round trip of striped frames allocates nothing on
// a link between hosts, whether its senders are still measuring, have
// chosen their lanes, or have them set.
func TestLanesZeroAllocs(t *testing.T) {
	for _, tc := range []struct {
		lanes  int
		settle bool
	}{{0, false}, {0, true}, {4, false}} {
		lanes := tc.lanes
		t.Run(fmt.Sprintf("lanes %d, settled first %v", lanes, tc.settle), func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Lanes = lanes
			// A guard against a hang, not a speed check: settling moves up
			// to 100 rounds of 8 MiB each way, about 6 s under -race alone,
			// and took over 60 s once in CI beside other packages' tests.
			ctx := conformance.TimeoutCtx(t, 180*time.Second)
			links := twoHosts(t, ctx, cfg)
			pair := []transport.Link{links[0][1], links[1][0]}
			if tc.settle {
				for _, l := range pair {
					tcp.SetLaneTrial(l, 256<<10, 1<<20)
					tcp.CountPauses(l)
				}
				for round := 0; ; round++ {
					if err := exchangeConcurrently(ctx, pair, 1, 8, []int{1 << 20}); err != nil {
						s0, _, _ := tcp.LanesChosen(pair[0])
						s1, _, _ := tcp.LanesChosen(pair[1])
						t.Fatalf("settling, round %d (settled: %v, %v; sending over %d and %d lanes): %v", round, s0, s1, tcp.SendLanes(pair[0]), tcp.SendLanes(pair[1]), err)
					}
					s0, _, _ := tcp.LanesChosen(pair[0])
					s1, _, _ := tcp.LanesChosen(pair[1])
					if s0 && s1 {
						break
					}
					if round == 100 {
						t.Fatal("the senders did not settle within 100 rounds")
					}
				}
			}
			const n, runs = 1 << 20, 20
			payload, buf, rbuf := make([]byte, n), make([]byte, n), make([]byte, n)
			h := transport.Header{Kind: transport.FrameData, Length: n}
			done := make(chan error, 1)
			go func() {
				var rh transport.Header
				for range runs + 2 {
					if err := pair[1].RecvHeader(ctx, &rh); err != nil {
						done <- err
						return
					}
					if err := pair[1].RecvPayload(ctx, buf); err != nil {
						done <- err
						return
					}
					if err := pair[1].Send(ctx, &rh, buf); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			var rh transport.Header
			roundTrip := func() {
				if err := pair[0].Send(ctx, &h, payload); err != nil {
					t.Fatal(err)
				}
				if err := pair[0].RecvHeader(ctx, &rh); err != nil {
					t.Fatal(err)
				}
				if err := pair[0].RecvPayload(ctx, rbuf); err != nil {
					t.Fatal(err)
				}
			}
			roundTrip() // a count announced after settling goes out first
			allocs := testing.AllocsPerRun(runs, roundTrip)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Errorf("1 MiB round trip over %d of %d lanes: %v allocations, want 0", tcp.SendLanes(pair[0]), tcp.Lanes(pair[0]), allocs)
			}
		})
	}
}
