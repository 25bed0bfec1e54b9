package epoch_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

func worldOf(number uint64, names ...string) epoch.World {
	w := epoch.World{Number: number}
	for _, n := range names {
		w.Members = append(w.Members, epoch.Member{Name: n, Addr: n + ":1"})
	}
	return w
}

func TestCheckQuorum(t *testing.T) {
	for _, tc := range []struct {
		name     string
		base     epoch.World
		next     []string
		departed []string
		driver   bool
		want     bool
		missing  []string
	}{
		{"the job's first world needs none", epoch.World{}, []string{"a"}, nil, false, true, nil},
		{"unchanged", worldOf(3, "a", "b", "c"), []string{"a", "b", "c"}, nil, false, true, nil},
		{"a joiner adds no vote", worldOf(3, "a"), []string{"a", "j"}, nil, true, true, nil},
		{"two of three", worldOf(3, "a", "b", "c"), []string{"a", "b"}, nil, false, true, []string{"c"}},
		{"one of three suspected twice: no", worldOf(3, "a", "b", "c"), []string{"a"}, nil, true, false, []string{"b", "c"}},
		{"one of three, two known dead", worldOf(3, "a", "b", "c"), []string{"a"}, []string{"b", "c"}, false, true, nil},
		{"one of three, one known dead, one suspected, driver: tie won", worldOf(3, "a", "b", "c"), []string{"a"}, []string{"c"}, true, true, []string{"b"}},
		{"one of three, one known dead, one suspected, worker: tie lost", worldOf(3, "a", "b", "c"), []string{"a"}, []string{"c"}, false, false, []string{"b"}},
		{"half of two, driver: tie won", worldOf(5, "a", "b"), []string{"a"}, nil, true, true, []string{"b"}},
		{"half of two, worker: tie lost", worldOf(5, "a", "b"), []string{"b"}, nil, false, false, []string{"a"}},
		{"half of four, driver", worldOf(5, "a", "b", "c", "d"), []string{"a", "b"}, nil, true, true, []string{"c", "d"}},
		{"half of four, worker", worldOf(5, "a", "b", "c", "d"), []string{"c", "d"}, nil, false, false, []string{"a", "b"}},
		{"a world of one, alone", worldOf(2, "a"), []string{"a"}, nil, false, true, nil},
		{"a world of one, its member suspected: the driver waits", worldOf(2, "a"), []string{"j"}, nil, true, false, []string{"a"}},
		{"every member known gone", worldOf(2, "a", "b"), []string{"j"}, []string{"a", "b"}, false, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var next []epoch.Member
			for _, n := range tc.next {
				next = append(next, epoch.Member{Name: n})
			}
			q := epoch.CheckQuorum(tc.base, next, func(n string) bool { return slices.Contains(tc.departed, n) }, tc.driver)
			if q.OK() != tc.want || !slices.Equal(q.Missing, tc.missing) {
				t.Fatalf("got ok=%v missing=%v (%+v), want ok=%v missing=%v", q.OK(), q.Missing, q, tc.want, tc.missing)
			}
		})
	}
}

// TestCheckFirstQuorum: the job's first world has no earlier world to hold a
// majority of; its voters are the job's first workers (--np, less those
// known to be gone).
func TestCheckFirstQuorum(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int // the voters: --np less the first workers known gone
		next   int // members of the proposed world
		driver bool
		want   bool
	}{
		{"the job's size not known: none needed", 0, 1, false, true},
		{"2 of 4, a worker: the minority side of a cut waits", 4, 2, false, false},
		{"2 of 4, the driver: tie won", 4, 2, true, true},
		{"3 of 4, a worker", 4, 3, false, true},
		{"1 of 4, the driver: no", 4, 1, true, false},
		{"1 of 4, two known gone, the driver: tie won", 2, 1, true, true},
		{"2 of 3, a worker", 3, 2, false, true},
		{"1 of 3, the driver: no", 3, 1, true, false},
		{"a job of one", 1, 1, false, true},
		{"every first worker known gone", 0, 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := make([]epoch.Member, tc.next)
			for i := range next {
				next[i] = epoch.Member{Name: string(rune('a' + i))}
			}
			q := epoch.CheckFirstQuorum(tc.size, next, tc.driver)
			if q.OK() != tc.want || !q.First || q.Voters != tc.size || q.Present != tc.next {
				t.Fatalf("got ok=%v (%+v), want ok=%v", q.OK(), q, tc.want)
			}
		})
	}
}

// quorumHarness drives one proposer (the driver's, or a worker's that took
// over) and records the worlds it proposes and the quorums it lacked. Members
// in live acknowledge every epoch sent to them, as live workers do.
type quorumHarness struct {
	t        *testing.T
	p        *epoch.Proposer
	now      time.Time
	live     map[string]bool
	proposed []string
	blocked  []epoch.NoQuorum
	final    []string // the workers told that they are out for good
}

func (h *quorumHarness) carry(outs []epoch.Output) {
	for len(outs) > 0 {
		o := outs[0]
		outs = outs[1:]
		switch o := o.(type) {
		case epoch.Proposed:
			h.proposed = append(h.proposed, names(o.World))
		case epoch.NoQuorum:
			h.blocked = append(h.blocked, o)
		case epoch.Send:
			if !h.live[o.To] {
				continue
			}
			if o.Msg.Final && !slices.Contains(h.final, o.To) {
				h.final = append(h.final, o.To)
			}
			switch o.Msg.Kind {
			case epoch.MsgEpoch:
				outs = append(outs, h.p.Step(h.now, epoch.Received{From: o.To, Msg: epoch.Message{Kind: epoch.MsgPong, World: o.Msg.World}})...)
			case epoch.MsgPing:
				outs = append(outs, h.p.Step(h.now, epoch.Received{From: o.To, Msg: epoch.Message{Kind: epoch.MsgPong, Nonce: o.Msg.Nonce}})...)
			}
		}
	}
}

func names(w epoch.World) string {
	var s []string
	for _, m := range w.Members {
		s = append(s, m.Name)
	}
	return strings.Join(s, " ")
}

// step feeds an input, then lets time pass until the proposer is quiet (at
// most a minute).
func (h *quorumHarness) step(in epoch.Input) {
	h.carry(h.p.Step(h.now, in))
	h.settle()
}

func (h *quorumHarness) settle() {
	end := h.now.Add(time.Minute)
	for {
		d := h.p.Deadline()
		if d.IsZero() || d.After(end) {
			return
		}
		// Re-announcements every second never stop: stop once nothing but
		// them is due and every live worker has what it needs.
		if d.Sub(h.now) >= time.Second {
			return
		}
		h.now = d
		h.carry(h.p.Tick(h.now))
	}
}

func readyPeer(name string) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, Addr: name + ":1", State: epoch.Ready}}
}

// driverWith returns a driver's proposer whose first world, of names, every
// member adopted (the base of the quorum).
func driverWith(t *testing.T, names ...string) *quorumHarness {
	h := &quorumHarness{t: t, p: epoch.NewProposer(epoch.ProposerConfig{MinWorkers: 1}), now: t0, live: map[string]bool{}}
	for _, n := range names {
		h.live[n] = true
		h.carry(h.p.Step(h.now, readyPeer(n)))
	}
	h.settle()
	if len(h.proposed) != 1 {
		t.Fatalf("setup: proposed %q", h.proposed)
	}
	h.proposed, h.blocked = nil, nil
	return h
}

// takeOver returns the proposer of worker self, which took over from a
// driver gone from its view, knowing world from, seeing view (itself
// included); departed are known to be gone.
func takeOver(t *testing.T, self string, from epoch.World, view []string) *quorumHarness {
	return takeOverWith(t, epoch.ProposerConfig{MinWorkers: 1}, self, from, view)
}

// takeOverWith is takeOver with the proposer configured by cfg.
func takeOverWith(t *testing.T, cfg epoch.ProposerConfig, self string, from epoch.World, view []string) *quorumHarness {
	h := &quorumHarness{t: t, now: t0, live: map[string]bool{}}
	var peers []epoch.Peer
	for _, n := range view {
		h.live[n] = true
		peers = append(peers, epoch.Peer{Name: n, Addr: n + ":1", State: epoch.Ready})
	}
	var outs []epoch.Output
	cfg.Self = self
	h.p, outs = epoch.Resume(cfg, h.now, from, peers)
	h.carry(outs)
	h.settle()
	return h
}

// TestProposerQuorum: what the driver and a worker that took over propose
// when members are suspected (gossip declared them dead, or a partition
// hides them) or known to be gone (their process exited, they left).
func TestProposerQuorum(t *testing.T) {
	for _, tc := range []struct {
		name    string
		run     func(t *testing.T) *quorumHarness
		want    []string // the worlds proposed, after the setup's
		blocked int      // NoQuorum said at least this often (0: never)
	}{
		{
			// The split seen under load: gossip at the driver declared b
			// dead; b, no longer seeing the driver, took over. The driver's
			// side holds the tie; b alone may not form a world.
			name: "false death, the driver's side: a world of a",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b")
				h.live["b"] = false
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				return h
			},
			want: []string{"a"},
		},
		{
			name: "false death, the worker's side: no world of b alone",
			run: func(t *testing.T) *quorumHarness {
				return takeOver(t, "b", worldOf(1, "a", "b"), []string{"b"})
			},
			want: nil, blocked: 1,
		},
		{
			// Three workers, two killed (their processes' exits seen),
			// min-np 1: the survivor trains on, with the driver or
			// without.
			name: "real deaths, 2 of 3 exited: the driver goes on with one",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.Exited{Name: "b"})
				h.step(epoch.Exited{Name: "c"})
				return h
			},
			want: []string{"a c", "a"},
		},
		{
			name: "real deaths, 2 of 3 exited, seen by gossip first",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				h.step(epoch.PeerGone{Name: "c", Failed: true})
				h.step(epoch.Exited{Name: "b"})
				h.step(epoch.Exited{Name: "c"})
				return h
			},
			want: []string{"a c", "a"}, blocked: 1,
		},
		{
			name: "real deaths, 2 of 3 exited, no driver: the survivor takes over and goes on",
			run: func(t *testing.T) *quorumHarness {
				h := takeOver(t, "a", worldOf(4, "a", "b", "c"), []string{"a"})
				h.step(epoch.Exited{Name: "b"})
				h.step(epoch.Exited{Name: "c"})
				return h
			},
			want: []string{"a"}, blocked: 1,
		},
		{
			// Only suspected: they may be training on the other side.
			name: "2 of 3 suspected: the driver waits, and goes on once one is back",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				h.step(epoch.PeerGone{Name: "c", Failed: true})
				if len(h.proposed) != 1 {
					t.Fatalf("proposed %q while b and c were suspected", h.proposed)
				}
				h.live["b"] = true
				h.step(readyPeer("b"))
				return h
			},
			want: []string{"a c", "a b"}, blocked: 1,
		},
		{
			name: "2 of 3 left gracefully: the driver goes on with one",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.PeerGone{Name: "b"})
				h.step(epoch.PeerGone{Name: "c"})
				return h
			},
			want: []string{"a c", "a"},
		},
		{
			// A world not every member adopted is no base: b never
			// acknowledged {a b}, so it may be training in a world of
			// its own with c.
			name: "a world b never adopted does not count",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.PeerGone{Name: "c", Failed: true})
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				return h
			},
			want: []string{"a b"}, blocked: 1,
		},
		{
			name: "partition 2|2, the driver's half: goes on",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c", "d")
				h.live["c"], h.live["d"] = false, false
				h.step(epoch.PeerGone{Name: "c", Failed: true})
				h.step(epoch.PeerGone{Name: "d", Failed: true})
				return h
			},
			want: []string{"a b d", "a b"},
		},
		{
			// Cut right after a world change: a and b never received
			// {a b c d}, so they go on training in {a b} on their side;
			// {c d} would be a second world.
			name: "partition right after a world change: no world beside the one the cut-off half still trains in",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b")
				h.live["a"], h.live["b"] = false, false
				h.live["c"], h.live["d"] = true, true
				h.carry(h.p.Step(h.now, readyPeer("c"))) // together: one world change
				h.step(readyPeer("d"))
				h.carry(h.p.Step(h.now, epoch.PeerGone{Name: "a", Failed: true}))
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				return h
			},
			want: []string{"a b c d"}, blocked: 1,
		},
		{
			// The same cut a moment later: a and b adopted {a b c d}, so
			// they left {a b}; the driver's half of it goes on.
			name: "partition after the world change reached everyone: the driver's half goes on",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b")
				h.live["c"], h.live["d"] = true, true
				h.carry(h.p.Step(h.now, readyPeer("c")))
				h.step(readyPeer("d"))
				h.live["a"], h.live["b"] = false, false
				h.carry(h.p.Step(h.now, epoch.PeerGone{Name: "a", Failed: true}))
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				return h
			},
			want: []string{"a b c d", "c d"},
		},
		{
			name: "partition 2|2, the other half: waits",
			run: func(t *testing.T) *quorumHarness {
				return takeOver(t, "c", worldOf(1, "a", "b", "c", "d"), []string{"c", "d"})
			},
			want: nil, blocked: 1,
		},
		{
			name: "partition 1|2, the driver's side: waits",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a", "b", "c")
				h.live["b"], h.live["c"] = false, false
				h.step(epoch.PeerGone{Name: "b", Failed: true})
				h.step(epoch.PeerGone{Name: "c", Failed: true})
				return h
			},
			want: []string{"a c"}, blocked: 1,
		},
		{
			name: "partition 1|2, the majority without the driver: goes on",
			run: func(t *testing.T) *quorumHarness {
				return takeOver(t, "b", worldOf(1, "a", "b", "c"), []string{"b", "c"})
			},
			want: []string{"b c"},
		},
		{
			name: "a world of one: its member alone goes on and admits a joiner",
			run: func(t *testing.T) *quorumHarness {
				h := takeOver(t, "a", worldOf(3, "a"), []string{"a"})
				h.live["j"] = true
				h.step(readyPeer("j"))
				return h
			},
			want: []string{"a j"},
		},
		{
			name: "a world of one whose member is suspected: the driver admits no joiner instead",
			run: func(t *testing.T) *quorumHarness {
				h := driverWith(t, "a")
				h.live["a"] = false
				h.step(epoch.PeerGone{Name: "a", Failed: true})
				h.live["j"] = true
				h.step(readyPeer("j"))
				return h
			},
			want: nil, blocked: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.run(t)
			got := h.proposed
			if !slices.Equal(got, tc.want) {
				t.Fatalf("proposed %q, want %q (lacked the quorum %d times: %+v)", got, tc.want, len(h.blocked), h.blocked)
			}
			if len(h.blocked) < tc.blocked || (tc.blocked == 0 && len(h.blocked) > 0) {
				t.Fatalf("lacked the quorum %d times (%+v), want %d", len(h.blocked), h.blocked, tc.blocked)
			}
		})
	}
}

// TestProposerFirstWorld: the job's first world is proposed only with a
// strict majority of the job's first workers (FirstWorld, gorovod run's
// --np), or half of them when the driver proposes it. A cut as the first
// world forms leaves the workers on its far side with no world: the pair
// that takes over there, 2 of 4, must not form a first world of its own
// beside the driver's.
func TestProposerFirstWorld(t *testing.T) {
	firstOf := func(np int) epoch.ProposerConfig { return epoch.ProposerConfig{MinWorkers: 2, FirstWorld: np} }
	// driverOf is a driver's proposer of a job of np workers past its start
	// timeout (its minimum lowered to 1), seeing ready.
	driverOf := func(t *testing.T, np int, ready ...string) *quorumHarness {
		h := &quorumHarness{t: t, p: epoch.NewProposer(epoch.ProposerConfig{MinWorkers: 1, FirstWorld: np}), now: t0, live: map[string]bool{}}
		for _, n := range ready {
			h.live[n] = true
			h.step(readyPeer(n))
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		run     func(t *testing.T) *quorumHarness
		want    []string
		blocked int
	}{
		{
			name: "a cut as the first world forms, 2|2: the cut-off pair forms no first world",
			run: func(t *testing.T) *quorumHarness {
				return takeOverWith(t, firstOf(4), "c", epoch.World{}, []string{"c", "d"})
			},
			want: nil, blocked: 1,
		},
		{
			name: "the cut-off pair waits until a third first worker is ready on its side",
			run: func(t *testing.T) *quorumHarness {
				h := takeOverWith(t, firstOf(4), "c", epoch.World{}, []string{"c", "d"})
				h.live["b"] = true
				h.step(readyPeer("b"))
				return h
			},
			want: []string{"c d b"}, blocked: 1,
		},
		{
			name: "3 of 4 without the driver: a majority forms the first world",
			run: func(t *testing.T) *quorumHarness {
				return takeOverWith(t, firstOf(4), "b", epoch.World{}, []string{"b", "c", "d"})
			},
			want: []string{"b c d"},
		},
		{
			name: "2 of 3 without the driver: a majority",
			run: func(t *testing.T) *quorumHarness {
				return takeOverWith(t, firstOf(3), "b", epoch.World{}, []string{"b", "c"})
			},
			want: []string{"b c"},
		},
		{
			name: "the job's size not known: the cut-off pair forms a first world of its own",
			run: func(t *testing.T) *quorumHarness {
				return takeOverWith(t, firstOf(0), "c", epoch.World{}, []string{"c", "d"})
			},
			want: []string{"c d"},
		},
		{
			// a alone (1 of 4) is too few; with b the driver's half vote
			// wins the tie.
			name: "the driver, 2 of 4: the tie is its own",
			run:  func(t *testing.T) *quorumHarness { return driverOf(t, 4, "a", "b") },
			want: []string{"a b"}, blocked: 1,
		},
		{
			name: "the driver, 1 of 4, two of them exited before they joined: goes on",
			run: func(t *testing.T) *quorumHarness {
				h := driverOf(t, 4, "a")
				h.step(epoch.SetFirstWorld{N: 2})
				return h
			},
			want: []string{"a"}, blocked: 1,
		},
		{
			// The first world {a b} forms as soon as the driver holds
			// half of the four; the exits later are known deaths.
			name: "once a world exists the rule is the last world's quorum",
			run: func(t *testing.T) *quorumHarness {
				h := driverOf(t, 4, "a", "b", "c", "d")
				h.live["b"], h.live["c"], h.live["d"] = false, false, false
				h.step(epoch.Exited{Name: "b"})
				h.step(epoch.Exited{Name: "c"})
				h.step(epoch.Exited{Name: "d"})
				return h
			},
			want: []string{"a b", "a b c", "a b c d", "a c d", "a d", "a"}, blocked: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.run(t)
			if !slices.Equal(h.proposed, tc.want) {
				t.Fatalf("proposed %q, want %q (lacked the quorum %d times: %+v)", h.proposed, tc.want, len(h.blocked), h.blocked)
			}
			if len(h.blocked) < tc.blocked || (tc.blocked == 0 && len(h.blocked) > 0) {
				t.Fatalf("lacked the quorum %d times (%+v), want %d", len(h.blocked), h.blocked, tc.blocked)
			}
			for _, b := range h.blocked {
				if b.Base == 0 && !b.Quorum.First {
					t.Fatalf("a first world blocked without saying so: %+v", b)
				}
			}
		})
	}
}
