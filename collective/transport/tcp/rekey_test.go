package tcp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// world is one membership epoch in these tests: members are indices into
// the test's transports (their stable identity), listed in rank order.
type world struct {
	epoch   uint64
	members []int
}

func (w world) of(trs []*tcp.Transport, rank int) transport.World {
	addrs := make([]string, len(w.members))
	for r, m := range w.members {
		addrs[r] = trs[m].Addr()
	}
	return transport.World{JobID: "job", Epoch: w.epoch, Rank: rank, Addrs: addrs}
}

// connectWorld connects every member of w through Connect and returns the
// links, by member and then by rank.
func connectWorld(t *testing.T, ctx context.Context, trs []*tcp.Transport, w world) map[int][]transport.Link {
	t.Helper()
	out := make(map[int][]transport.Link)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(w.members))
	for r, m := range w.members {
		wg.Go(func() {
			ls, err := trs[m].Connect(ctx, w.of(trs, r))
			errs[r] = err
			mu.Lock()
			out[m] = ls
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}

// allreduceWorld builds a communicator per member of w over links (by
// member) and checks that an allreduce of each member's index+1 sums up,
// then releases every link for the next world (by member, by member of the
// peer). A small and a large (ring, several lanes) allreduce both run.
func allreduceWorld(t *testing.T, ctx context.Context, w world, trs []*tcp.Transport, links map[int][]transport.Link) map[int]map[int]transport.Link {
	t.Helper()
	want := float32(0)
	for _, m := range w.members {
		want += float32(m + 1)
	}
	kept := make(map[int]map[int]transport.Link)
	var mu sync.Mutex
	errs := make([]error, len(w.members))
	var wg sync.WaitGroup
	for r, m := range w.members {
		wg.Go(func() {
			comm, err := collective.NewFromLinks(w.of(trs, r), links[m], collective.Config{})
			if err != nil {
				errs[r] = err
				return
			}
			for _, n := range []int{4, 1 << 18} {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(m + 1)
				}
				if err := collective.Allreduce(ctx, comm, v, v, collective.Sum); err != nil {
					errs[r] = err
					comm.Close()
					return
				}
				if v[0] != want || v[n-1] != want {
					errs[r] = fmt.Errorf("member %d: sum %v..%v, want %v", m, v[0], v[n-1], want)
				}
			}
			out := comm.Release(func(int) bool { return true })
			byMember := make(map[int]transport.Link)
			for pr, l := range out {
				if l != nil {
					byMember[w.members[pr]] = l
				}
			}
			mu.Lock()
			kept[m] = byMember
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return kept
}

// carryWorld moves every member of next into it with transport.Carry,
// keeping the links of kept (by member, by peer member) to members of
// next, and returns the new links by member and how many each kept.
func carryWorld(t *testing.T, ctx context.Context, trs []*tcp.Transport, next world, kept map[int]map[int]transport.Link) (map[int][]transport.Link, map[int]int) {
	t.Helper()
	out := make(map[int][]transport.Link)
	counts := make(map[int]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(next.members))
	for r, m := range next.members {
		var mine []transport.Link
		if byPeer := kept[m]; byPeer != nil {
			mine = make([]transport.Link, len(next.members))
			for pr, pm := range next.members {
				mine[pr] = byPeer[pm]
				delete(byPeer, pm)
			}
			for _, l := range byPeer { // peers that left
				l.Close()
			}
		}
		wg.Go(func() {
			var told sync.Map // the ranks CarryAhead said were linked
			ls, n, err := transport.CarryAhead(ctx, trs[m], next.of(trs, r), mine, nil, nil, transport.CarryWatch{Linked: func(pr int) {
				if _, again := told.LoadOrStore(pr, true); again {
					t.Errorf("member %d: rank %d reported linked twice", m, pr)
				}
			}})
			for pr, l := range ls {
				if _, ok := told.Load(pr); ok != (l != nil) {
					t.Errorf("member %d: rank %d reported linked %v, has a link %v", m, pr, ok, l != nil)
				}
			}
			errs[r] = err
			mu.Lock()
			out[m], counts[m] = ls, n
			mu.Unlock()
		})
	}
	for m, byPeer := range kept { // members that left
		if !slices.Contains(next.members, m) {
			for _, l := range byPeer {
				l.Close()
			}
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out, counts
}

// connsByPair is every link's connections, by the pair of members it joins.
func connsByPair(w world, links map[int][]transport.Link) map[[2]int][]string {
	out := make(map[[2]int][]string)
	for m, ls := range links {
		for pr, l := range ls {
			if l != nil {
				out[[2]int{m, w.members[pr]}] = tcp.Conns(l)
			}
		}
	}
	return out
}

// TestRekeyKeepsSurvivingLinks: a world of 4 becomes one of 3 and then one
// of 4 again, on real sockets, with the ranks of the members that stay
// changing each time. The pairs that survive a change keep their
// connections (the same local and remote ports on every lane), the new
// member's pairs are dialled, and collectives give the right sums in each
// world.
func TestRekeyKeepsSurvivingLinks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sec   transport.Security
		lanes int
	}{
		{"authenticated", transport.SecurityAuthenticated, 1},
		{"encrypted 2 lanes", transport.SecurityEncrypted, 2},
		{"plain", transport.SecurityPlain, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Security, cfg.Lanes = tc.sec, tc.lanes
			trs := listenN(t, 5, cfg)
			ctx := conformance.TimeoutCtx(t, 60*time.Second)
			worlds := []world{
				{1, []int{0, 1, 2, 3}},
				{2, []int{1, 2, 3}},    // member 0 leaves: every rank moves down
				{3, []int{1, 4, 2, 3}}, // member 4 joins at rank 1: 2 and 3 move up
			}
			links := connectWorld(t, ctx, trs, worlds[0])
			for i := 1; i < len(worlds); i++ {
				prev, next := worlds[i-1], worlds[i]
				before := connsByPair(prev, links)
				kept := allreduceWorld(t, ctx, prev, trs, links)
				var counts map[int]int
				links, counts = carryWorld(t, ctx, trs, next, kept)
				// The transports now refuse the old world for good, even
				// where nothing was dialled into the new one.
				dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := dialRaw(dctx, trs[next.members[0]].Addr(), testSecret, "job", prev.epoch, 3, 0, 4)
				dcancel()
				var he *transport.HandshakeError
				if !errors.As(err, &he) || !he.Fatal || !strings.Contains(he.Reason, "stale epoch") {
					t.Errorf("epoch %d: a dial into epoch %d: %v, want a fatal refusal for a stale epoch", next.epoch, prev.epoch, err)
				}
				after := connsByPair(next, links)
				for pair, conns := range after {
					stayed := slices.Contains(prev.members, pair[0]) && slices.Contains(prev.members, pair[1])
					switch {
					case stayed && !slices.Equal(conns, before[pair]):
						t.Errorf("epoch %d: members %v were redialled: %v, before %v", next.epoch, pair, conns, before[pair])
					case !stayed && before[pair] != nil:
						t.Errorf("epoch %d: members %v had a link before", next.epoch, pair)
					}
					if len(conns) != tc.lanes {
						t.Errorf("epoch %d: members %v: %d lanes, want %d", next.epoch, pair, len(conns), tc.lanes)
					}
				}
				for _, m := range next.members {
					want := 0
					if slices.Contains(prev.members, m) {
						for _, o := range next.members {
							if o != m && slices.Contains(prev.members, o) {
								want++
							}
						}
					}
					if counts[m] != want {
						t.Errorf("epoch %d: member %d kept %d links, want %d", next.epoch, m, counts[m], want)
					}
				}
			}
			kept := allreduceWorld(t, ctx, worlds[len(worlds)-1], trs, links)
			for _, byPeer := range kept {
				for _, l := range byPeer {
					l.Close()
				}
			}
		})
	}
}

// recordingProxy is a path that keeps a copy of every byte the dialer
// sends after the handshake, and can write bytes of its own into the
// stream to the target.
type recordingProxy struct {
	*pathProxy
	mu  sync.Mutex // held while a chunk is recorded and forwarded
	rec []byte
	// byConn is what the dialer sent on each connection to the target, by
	// that connection (a link's lanes are connections of their own).
	byConn map[net.Conn][]byte
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	p := &recordingProxy{byConn: make(map[net.Conn][]byte)}
	p.pathProxy = newPathProxy(t, target, func(client, server net.Conn) {
		if _, err := io.CopyN(server, client, handshake.HelloSize+handshake.ResponseSize); err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				p.rec = append(p.rec, buf[:n]...)
				p.byConn[server] = append(p.byConn[server], buf[:n]...)
				_, werr := server.Write(buf[:n])
				p.mu.Unlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return p
}

// recorded returns and forgets what the dialer sent since the last call.
func (p *recordingProxy) recorded() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.rec
	p.rec = nil
	return b
}

// toTarget is the proxy's i-th connection to the target, in the order the
// dialer opened them (a link's lanes in order).
func (p *recordingProxy) toTarget(t *testing.T, i int) net.Conn {
	t.Helper()
	p.pathProxy.mu.Lock()
	defer p.pathProxy.mu.Unlock()
	if 2*i+1 >= len(p.conns) {
		t.Fatalf("the proxy has %d connections to the target, not %d", len(p.conns)/2, i+1)
	}
	return p.conns[2*i+1] // conns holds each pair as dialer's, target's
}

// recordedOn returns what the dialer sent on connection c so far.
func (p *recordingProxy) recordedOn(c net.Conn) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.byConn[c])
}

// injectOn writes b into connection c to the target, between the dialer's
// bytes.
func (p *recordingProxy) injectOn(c net.Conn, b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := c.Write(b)
	return err
}

// inject writes b into the stream to the target, between the dialer's bytes.
func (p *recordingProxy) inject(b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.lastToTarget().Write(b)
	return err
}

// TestRekeyRejectsOldFrames: a frame of the old world, recorded on the path
// and replayed after the link moved into the new world (where both ends'
// ranks changed), makes the receiver fail with a *transport.PeerError
// naming the sender by its new rank: a sealed link refuses it as
// unauthenticated (the keys and counters are new), a plain one as a frame
// of another epoch.
func TestRekeyRejectsOldFrames(t *testing.T) {
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted, transport.SecurityPlain} {
		t.Run(sec.String(), func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Security = sec
			trs := listenN(t, 2, cfg)
			proxy := newRecordingProxy(t, trs[0].Addr())
			ctx := conformance.TimeoutCtx(t, 20*time.Second)
			links := connectVia(t, ctx, trs, proxy.addr())
			a, b := links[0][1], links[1][0] // trs[0]'s link to trs[1], and back

			// Epoch 1: trs[1] (rank 1) sends a frame, trs[0] takes it.
			payload := []byte("a frame of epoch 1")
			send := func(l transport.Link, p []byte) error {
				h := transport.Header{Kind: transport.FrameData, Length: uint32(len(p))}
				return l.Send(ctx, &h, p)
			}
			recv := func(l transport.Link) ([]byte, error) {
				var h transport.Header
				if err := l.RecvHeader(ctx, &h); err != nil {
					return nil, err
				}
				p := make([]byte, h.Length)
				return p, l.RecvPayload(ctx, p)
			}
			if err := send(b, payload); err != nil {
				t.Fatal(err)
			}
			if got, err := recv(a); err != nil || string(got) != string(payload) {
				t.Fatalf("epoch 1: got %q, %v", got, err)
			}
			old := proxy.recorded()

			// Epoch 2: the ranks swap; both ends re-key.
			addrs := []string{trs[1].Addr(), proxy.addr()}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			wg.Go(func() {
				errs[0] = b.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "job", Epoch: 2, Rank: 0, Addrs: addrs}, 1)
			})
			wg.Go(func() {
				errs[1] = a.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "job", Epoch: 2, Rank: 1, Addrs: addrs}, 0)
			})
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if a.Peer() != 0 || b.Peer() != 1 {
				t.Fatalf("after the rekey the peers are ranks %d and %d, want 0 and 1", a.Peer(), b.Peer())
			}
			if err := send(a, []byte("epoch 2")); err != nil {
				t.Fatal(err)
			}
			if got, err := recv(b); err != nil || string(got) != "epoch 2" {
				t.Fatalf("epoch 2: got %q, %v", got, err)
			}

			// The old frame, replayed as the first of the new world from
			// trs[1]: where the counters start again, only new keys tell
			// it from a frame of the new world.
			if err := proxy.inject(old); err != nil {
				t.Fatal(err)
			}
			_, err := recv(a)
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Rank != 0 {
				t.Fatalf("replayed frame: %v, want a *transport.PeerError naming rank 0", err)
			}
			var fe *transport.FrameError
			switch {
			case sec != transport.SecurityPlain && !errors.Is(err, transport.ErrFrameAuth):
				t.Fatalf("replayed frame: %v, want ErrFrameAuth", err)
			case sec == transport.SecurityPlain && (!errors.As(err, &fe) || fe.Peer != 0):
				t.Fatalf("replayed frame: %v, want a *transport.FrameError from rank 0", err)
			}
			t.Logf("replayed frame refused: %v", err)
		})
	}
}

// TestRekeyRejectsOldStripes: a link's lanes after the first exchange no
// rekey frames of their own (their new keys come from the first lane's
// exchange, each from its own chaining secret), yet a stripe of the old
// world, recorded on the second lane and replayed there after the re-key,
// makes the receiver of the next striped frame fail with
// transport.ErrFrameAuth naming the sender by its new rank. The recorded
// stripe was the lane's first, as the replayed one lands where the new
// world's first is due: the counters match, and only new keys tell them
// apart.
func TestRekeyRejectsOldStripes(t *testing.T) {
	for _, sec := range []transport.Security{transport.SecurityAuthenticated, transport.SecurityEncrypted} {
		t.Run(sec.String(), func(t *testing.T) {
			checkNoLeaks(t)
			cfg := testConfig()
			cfg.Security, cfg.Lanes = sec, 2
			trs := listenN(t, 2, cfg)
			proxy := newRecordingProxy(t, trs[0].Addr())
			ctx := conformance.TimeoutCtx(t, 20*time.Second)
			links := connectVia(t, ctx, trs, proxy.addr())
			a, b := links[0][1], links[1][0] // trs[0]'s link to trs[1], and back
			// Large enough to be cut into a stripe per lane.
			frame := make([]byte, 1<<20)
			for i := range frame {
				frame[i] = byte(i)
			}
			send := func(l transport.Link) error {
				h := transport.Header{Kind: transport.FrameData, Length: uint32(len(frame))}
				return l.Send(ctx, &h, frame)
			}
			recv := func(l transport.Link) error {
				var h transport.Header
				if err := l.RecvHeader(ctx, &h); err != nil {
					return err
				}
				got := make([]byte, h.Length)
				if err := l.RecvPayload(ctx, got); err != nil {
					return err
				}
				if !slices.Equal(got, frame) {
					return errors.New("the frame arrived changed")
				}
				return nil
			}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			wg.Go(func() { errs[0] = send(b) })
			wg.Go(func() { errs[1] = recv(a) })
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("epoch 1: %v", err)
			}
			second := proxy.toTarget(t, 1)
			old := proxy.recordedOn(second)
			if len(old) == 0 {
				t.Fatal("nothing went on the second lane: the frame was not striped")
			}

			// Epoch 2: the ranks swap; both ends re-key.
			addrs := []string{trs[1].Addr(), proxy.addr()}
			wg.Go(func() {
				errs[0] = b.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "job", Epoch: 2, Rank: 0, Addrs: addrs}, 1)
			})
			wg.Go(func() {
				errs[1] = a.(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "job", Epoch: 2, Rank: 1, Addrs: addrs}, 0)
			})
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if got := proxy.recordedOn(second); !slices.Equal(got, old) {
				t.Fatalf("the re-key sent %d bytes on the second lane, want none", len(got)-len(old))
			}

			// The old stripe first on the second lane, then the new
			// world's striped frame.
			if err := proxy.injectOn(second, old); err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { errs[0] = send(b) })
			err := recv(a)
			a.Close() // the sender may wait on its lanes
			wg.Wait()
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Rank != 0 || !errors.Is(err, transport.ErrFrameAuth) {
				t.Fatalf("replayed stripe: %v, want ErrFrameAuth in a *transport.PeerError naming rank 0", err)
			}
			t.Logf("replayed stripe refused: %v", err)
		})
	}
}

// TestRekeyFailureFallsBack: a kept link that cannot be re-keyed — its
// connection cut on the path, the two ends moving to different worlds, or
// a rekey frame changed on the way — ends the re-key with an error on
// both ends (never a hang), and transport.Carry dials the pair afresh.
func TestRekeyFailureFallsBack(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	trs := listenN(t, 2, cfg)
	proxy := newRecordingProxy(t, trs[0].Addr())
	ctx := conformance.TimeoutCtx(t, 30*time.Second)

	// Different worlds on the two ends: both fail with ErrRekey.
	links := connectVia(t, ctx, trs, proxy.addr())
	addrs := []string{proxy.addr(), trs[1].Addr()}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			errs[r] = links[r][1-r].(transport.RekeyableLink).Rekey(ctx, transport.World{JobID: "job", Epoch: uint64(2 + r), Rank: r, Addrs: addrs}, 1-r)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, transport.ErrRekey) {
			t.Fatalf("rank %d moving to another world than its peer: %v, want ErrRekey", r, err)
		}
		conformance.AsPeerError(t, err, 1-r, transport.ErrRekey)
	}

	// A cut connection: Carry falls back to a fresh dial on both ends.
	links = connectVia(t, ctx, trs, proxy.addr())
	before := tcp.Conns(links[0][1])
	proxy.cut()
	var got [2][]transport.Link
	var kept [2]int
	for r := range 2 {
		wg.Go(func() {
			w := transport.World{JobID: "job", Epoch: 5, Rank: r, Addrs: addrs}
			got[r], kept[r], errs[r] = transport.Carry(ctx, trs[r], w, links[r], nil)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	defer conformance.CloseAll(got[:])
	if kept != [2]int{} {
		t.Fatalf("kept %v links over a cut connection", kept)
	}
	if after := tcp.Conns(got[0][1]); slices.Equal(after, before) {
		t.Fatalf("the cut link was not dialled again: %v", after)
	}
	for r := range 2 {
		wg.Go(func() {
			comm, err := collective.NewFromLinks(transport.World{JobID: "job", Epoch: 5, Rank: r, Addrs: addrs}, got[r], collective.Config{})
			if err != nil {
				errs[r] = err
				return
			}
			v := []float32{float32(r + 1)}
			errs[r] = collective.Allreduce(ctx, comm, v, v, collective.Sum)
			if errs[r] == nil && v[0] != 3 {
				errs[r] = fmt.Errorf("sum %v, want 3", v[0])
			}
			comm.Close()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestCarryRekeysWhileAheadConnects: at a join, the members that stay
// re-key their kept links while their links to the joiner, connected
// ahead, are still being finished (transport.CarryAhead), not after. Here
// member 0's connect ahead finishes only once member 1 has entered the new
// world, which needs member 0's re-key: a carry that waited for the
// connect ahead before it re-keyed would hold both until the deadline.
func TestCarryRekeysWhileAheadConnects(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	cfg.Lanes = 2
	trs := listenN(t, 3, cfg)
	ctx := conformance.TimeoutCtx(t, 60*time.Second)
	prev, next := world{1, []int{0, 1}}, world{2, []int{0, 1, 2}}
	kept := allreduceWorld(t, ctx, prev, trs, connectWorld(t, ctx, trs, prev))
	// Within this deadline, far under the test's: a carry that waits for
	// the connect ahead first fails here.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	entered1 := make(chan struct{}) // member 1's carry has returned
	out := make(map[int][]transport.Link)
	counts := make(map[int]int)
	var mu sync.Mutex
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, m := range next.members {
		w := next.of(trs, r)
		if m == 2 {
			wg.Go(func() {
				ls, err := trs[m].Connect(cctx, w)
				errs[r] = err
				mu.Lock()
				out[m] = ls
				mu.Unlock()
			})
			continue
		}
		mine := []transport.Link{kept[m][0], kept[m][1], nil}
		mine[r] = nil
		// The connect ahead (Session.Prepare's): the link to the joiner.
		want := []bool{false, false, true}
		type result struct {
			ls  []transport.Link
			err error
		}
		done := make(chan result, 1)
		go func() {
			ls, err := trs[m].ConnectSome(cctx, w, want)
			done <- result{ls, err}
		}()
		ahead := &transport.Ahead{Want: want, Wait: func(ctx context.Context) ([]transport.Link, error) {
			var res result
			select {
			case res = <-done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if m == 0 {
				select {
				case <-entered1:
				case <-ctx.Done():
					closeAllLinks(res.ls)
					return nil, fmt.Errorf("member 1 never entered the new world: %w", ctx.Err())
				}
			}
			return res.ls, res.err
		}}
		wg.Go(func() {
			ls, n, err := transport.CarryAhead(cctx, trs[m], w, mine, ahead, nil, transport.CarryWatch{})
			if m == 1 {
				close(entered1)
			}
			errs[r] = err
			mu.Lock()
			out[m], counts[m] = ls, n
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{0, 1} {
		if counts[m] != 1 {
			t.Errorf("member %d kept %d links, want 1", m, counts[m])
		}
	}
	for _, byPeer := range allreduceWorld(t, ctx, next, trs, out) {
		for _, l := range byPeer {
			l.Close()
		}
	}
}

// TestCarryAheadFails: when the connect ahead fails, the carry ends with
// its error at once, without waiting for the kept links' re-keys (whose
// peers may never come), and closes what it was handed.
func TestCarryAheadFails(t *testing.T) {
	checkNoLeaks(t)
	cfg := testConfig()
	trs := listenN(t, 3, cfg)
	ctx := conformance.TimeoutCtx(t, 60*time.Second)
	prev, next := world{1, []int{0, 1}}, world{2, []int{0, 1, 2}}
	kept := allreduceWorld(t, ctx, prev, trs, connectWorld(t, ctx, trs, prev))
	defer kept[1][0].Close()
	boom := errors.New("the connect ahead failed")
	ahead := &transport.Ahead{Want: []bool{false, false, true}, Wait: func(context.Context) ([]transport.Link, error) { return nil, boom }}
	began := time.Now()
	ls, _, err := transport.CarryAhead(ctx, trs[0], next.of(trs, 0), []transport.Link{nil, kept[0][1], nil}, ahead, nil, transport.CarryWatch{})
	if !errors.Is(err, boom) || ls != nil {
		t.Fatalf("CarryAhead: %v links, %v; want none and %v", ls, err, boom)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("CarryAhead took %v to give up", took)
	}
	// The kept link was closed: member 1's end of it sees the end, after
	// member 0's rekey frame at most.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	var buf [transport.RekeyMsgSize]byte
	for i := 0; ; i++ {
		var h transport.Header
		if err := kept[1][0].RecvHeader(rctx, &h); err != nil {
			if rctx.Err() != nil {
				t.Errorf("member 1's end of the kept link: %v, want the end of the link member 0 closed", err)
			}
			break
		}
		if i > 0 || h.Kind != transport.FrameRekey {
			t.Fatalf("member 1 received a %v frame on the link member 0 should have closed", h.Kind)
		}
		if err := kept[1][0].RecvPayload(rctx, buf[:h.Length]); err != nil {
			break
		}
	}
}

func closeAllLinks(ls []transport.Link) {
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
}

// TestCarryDialsOnceTheConnectAheadEnds: a transport connects a world once
// at a time, so the ranks a carry still has to dial (a world that failed
// carries no links) wait for the connect ahead of the same world to end,
// where dialling alongside it was refused ("already being connected"). Here
// member 0 connected ahead to the joiner (2), as Session.Prepare does, and
// its world with member 1 failed before the step boundary: its carry keeps
// nothing and dials member 1, while 1 and the joiner connect the whole new
// world.
func TestCarryDialsOnceTheConnectAheadEnds(t *testing.T) {
	checkNoLeaks(t)
	trs := listenN(t, 3, testConfig())
	ctx := conformance.TimeoutCtx(t, 60*time.Second)
	next := world{2, []int{0, 1, 2}}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	type result struct {
		ls  []transport.Link
		err error
	}
	want := []bool{false, false, true}
	aheadDone := make(chan result, 1)
	go func() {
		ls, err := trs[0].ConnectSome(cctx, next.of(trs, 0), want)
		aheadDone <- result{ls, err}
	}()
	ahead := &transport.Ahead{Want: want, Wait: func(ctx context.Context) ([]transport.Link, error) {
		select {
		case res := <-aheadDone:
			return res.ls, res.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
	out := make(map[int][]transport.Link)
	var mu sync.Mutex
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, m := range next.members {
		wg.Go(func() {
			var ls []transport.Link
			var err error
			if m == 0 {
				ls, _, err = transport.CarryAhead(cctx, trs[0], next.of(trs, r), nil, ahead, nil, transport.CarryWatch{})
			} else {
				ls, err = trs[m].Connect(cctx, next.of(trs, r))
			}
			errs[r] = err
			mu.Lock()
			out[m] = ls
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, ls := range out {
			closeAllLinks(ls)
		}
		t.Fatal(err)
	}
	for _, byPeer := range allreduceWorld(t, ctx, next, trs, out) {
		for _, l := range byPeer {
			l.Close()
		}
	}
}
