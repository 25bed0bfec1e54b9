package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// checkPlan verifies the invariants of a Replicate plan: every receiver's
// stripes come from distinct holders, at most want of them, and tile
// [0, count·esz) in order, each a whole number of elements.
func checkPlan(plan []stripe, holders, receivers []int, count, esz int, want func(r int) int) error {
	for _, r := range receivers {
		off := 0
		seen := map[int]bool{}
		n := 0
		for _, s := range plan {
			if s.to != r {
				continue
			}
			n++
			switch {
			case !slices.Contains(holders, s.from):
				return fmt.Errorf("receiver %d: stripe from %d, not a holder", r, s.from)
			case seen[s.from]:
				return fmt.Errorf("receiver %d: two stripes from %d", r, s.from)
			case s.off != off:
				return fmt.Errorf("receiver %d: stripe from %d starts at %d, want %d", r, s.from, s.off, off)
			case s.n%esz != 0:
				return fmt.Errorf("receiver %d: stripe from %d of %d bytes, not whole %d-byte elements", r, s.from, s.n, esz)
			}
			seen[s.from] = true
			off += s.n
		}
		if off != count*esz {
			return fmt.Errorf("receiver %d: stripes cover %d bytes, want %d", r, off, count*esz)
		}
		if w := want(r); n != w {
			return fmt.Errorf("receiver %d: %d stripes, want %d", r, n, w)
		}
	}
	for _, s := range plan {
		if !slices.Contains(receivers, s.to) {
			return fmt.Errorf("stripe to %d, not a receiver", s.to)
		}
	}
	return nil
}

// TestReplicatePlan: the plan's stripes tile every receiver's buffer from
// distinct holders; the automatic k takes holders of the receiver's host
// only when there are some, else one per other host; no stripe is smaller
// than the minimum; receivers spread over the holders.
func TestReplicatePlan(t *testing.T) {
	hostsOf := func(l hostLayout) Topology {
		return topologyOf(transport.World{JobID: "j", Addrs: make([]string, len(l.hosts)), Hosts: l.hosts})
	}
	for _, tc := range []struct {
		name               string
		layout             hostLayout
		holders, receivers []int
		k, count, esz, min int
		want               func(topo Topology, r int) int
		sources            map[int][]int // receiver → its sources, in order, when checked
	}{
		{name: "one host k=3", layout: blocked(6), holders: []int{0, 1, 2, 3}, receivers: []int{4, 5}, k: 3, count: 1001, esz: 4, min: 64,
			want: func(Topology, int) int { return 3 }, sources: map[int][]int{4: {0, 1, 2}, 5: {3, 0, 1}}},
		{name: "k above holders", layout: blocked(4), holders: []int{0, 2}, receivers: []int{1, 3}, k: 8, count: 7, esz: 1, min: 1,
			want: func(Topology, int) int { return 2 }},
		{name: "small buffer caps stripes", layout: blocked(9), holders: []int{0, 1, 2, 3, 4, 5, 6, 7}, receivers: []int{8}, k: 8, count: 100, esz: 4, min: 128,
			want: func(Topology, int) int { return 3 }},
		{name: "count below k", layout: blocked(9), holders: []int{0, 1, 2, 3, 4, 5, 6, 7}, receivers: []int{8}, k: 8, count: 3, esz: 2, min: 1,
			want: func(Topology, int) int { return 3 }},
		{name: "auto prefers local holders", layout: blocked(3, 3), holders: []int{0, 1, 3, 4}, receivers: []int{2, 5}, count: 1 << 20, esz: 4, min: 64,
			want: func(Topology, int) int { return 2 }, sources: map[int][]int{2: {0, 1}, 5: {3, 4}}},
		{name: "auto caps local holders", layout: blocked(6), holders: []int{0, 1, 2, 3, 4}, receivers: []int{5}, count: 1 << 20, esz: 4, min: 64,
			want: func(Topology, int) int { return autoLocalSources }},
		{name: "auto one per remote host", layout: blocked(2, 2, 2, 1), holders: []int{0, 1, 2, 3, 4, 5}, receivers: []int{6}, count: 1 << 20, esz: 4, min: 64,
			want: func(Topology, int) int { return 3 }, sources: map[int][]int{6: {0, 2, 4}}},
		{name: "auto remote spreads receivers", layout: blocked(1, 1, 2), holders: []int{0, 1}, receivers: []int{2, 3}, count: 1 << 20, esz: 4, min: 64,
			want: func(Topology, int) int { return 2 }, sources: map[int][]int{2: {0, 1}, 3: {0, 1}}},
		{name: "interleaved hosts", layout: interleaved(3, 2, 1), holders: []int{0, 1, 2, 3}, receivers: []int{4, 5}, k: 2, count: 999, esz: 8, min: 64,
			want: func(Topology, int) int { return 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo := hostsOf(tc.layout)
			plan := replicaPlan(topo, tc.holders, tc.receivers, tc.count, tc.esz, tc.k, tc.min)
			if err := checkPlan(plan, tc.holders, tc.receivers, tc.count, tc.esz, func(r int) int { return tc.want(topo, r) }); err != nil {
				t.Fatalf("%v\nplan %+v", err, plan)
			}
			// No more stripes than the minimum stripe allows.
			for _, r := range tc.receivers {
				n := 0
				for _, s := range plan {
					if s.to == r {
						n++
					}
				}
				if limit := max(1, tc.count*tc.esz/tc.min); n > limit {
					t.Errorf("receiver %d: %d stripes of a %d-byte buffer with a %d-byte minimum", r, n, tc.count*tc.esz, tc.min)
				}
			}
			for r, want := range tc.sources {
				var got []int
				for _, s := range plan {
					if s.to == r {
						got = append(got, s.from)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("receiver %d: sources %v, want %v", r, got, want)
				}
			}
			if again := replicaPlan(topo, tc.holders, tc.receivers, tc.count, tc.esz, tc.k, tc.min); !slices.Equal(again, plan) {
				t.Errorf("the plan differs between two computations")
			}
		})
	}
}

// countingTCPMesh is tcpMesh with every link counting into sent[from][to].
func countingTCPMesh(sent [][]atomic.Int64) meshFunc {
	return func(t testing.TB, w transport.World) [][]transport.Link {
		mesh := tcpMesh(t, w)
		for r, links := range mesh {
			for q, l := range links {
				if l != nil {
					links[q] = countingLink{Link: l, sent: &sent[r][q]}
				}
			}
		}
		return mesh
	}
}

// TestReplicate runs Replicate over real loopback sockets and checks that
// every receiver ends with the holders' bytes, bit for bit, that ranks in
// neither set are untouched, and that the bytes each link carried are
// exactly the plan's stripes (so each receiver was fed by k holders, not
// one).
func TestReplicate(t *testing.T) {
	type tc struct {
		p                  int
		holders, receivers []int
		k, count           int
		dt                 DType
	}
	var cases []tc
	for k := 1; k <= 8; k++ {
		cases = append(cases,
			tc{9, []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{8}, k, 1001, Float32},
			tc{9, []int{1, 3, 4, 5, 6, 7, 8}, []int{0, 2}, k, 4099, Float64},
		)
	}
	cases = append(cases,
		tc{4, []int{0}, []int{1, 2, 3}, 3, 333, Float16},
		tc{5, []int{0, 4}, []int{2}, 2, 1, Float32}, // one element: one stripe
		tc{5, []int{0, 1}, []int{3, 4}, 2, 777, Uint8},
		tc{3, []int{0, 1, 2}, nil, 2, 100, Float32},          // nothing to do
		tc{6, []int{2, 5}, []int{0, 1, 3, 4}, 0, 513, Int32}, // auto: one host, both holders
	)
	for _, c := range cases {
		t.Run(fmt.Sprintf("p=%d/h=%v/r=%v/k=%d/n=%d/%v", c.p, c.holders, c.receivers, c.k, c.count, c.dt), func(t *testing.T) {
			sent := make([][]atomic.Int64, c.p)
			for r := range sent {
				sent[r] = make([]atomic.Int64, c.p)
			}
			cfg := Config{ChunkBytes: 64, StripeSources: c.k, AbortTimeout: time.Second}
			comms := newWorld(t, countingTCPMesh(sent), c.p, cfg)
			esz := c.dt.Size()
			want := make([]byte, c.count*esz)
			for i := range want {
				want[i] = byte(i*7 + i/251 + 1)
			}
			bufs := make([][]byte, c.p)
			for r := range bufs {
				switch {
				case slices.Contains(c.holders, r):
					bufs[r] = bytes.Clone(want)
				default:
					bufs[r] = bytes.Repeat([]byte{0xEE}, len(want))
				}
			}
			noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, cm *Communicator) error {
				return cm.Replicate(ctx, HostBuffer(c.dt, bufs[cm.Rank()]), c.holders, c.receivers)
			}))
			for r := range bufs {
				switch {
				case slices.Contains(c.holders, r) || slices.Contains(c.receivers, r):
					if !bytes.Equal(bufs[r], want) {
						i := 0
						for i < len(want) && bufs[r][i] == want[i] {
							i++
						}
						t.Errorf("rank %d: bytes differ from the holders' first at byte %d of %d", r, i, len(want))
					}
				case !bytes.Equal(bufs[r], bytes.Repeat([]byte{0xEE}, len(want))):
					t.Errorf("rank %d, neither holder nor receiver, was written", r)
				}
			}
			// Each link carried its stripe, nothing more.
			plan := replicaPlan(comms[0].topo, c.holders, c.receivers, c.count, esz, c.k, cfg.ChunkBytes)
			wantSent := make([][]int64, c.p)
			for r := range wantSent {
				wantSent[r] = make([]int64, c.p)
			}
			for _, s := range plan {
				wantSent[s.from][s.to] += int64(s.n)
			}
			for from := range sent {
				for to := range sent[from] {
					if got := sent[from][to].Load(); got != wantSent[from][to] {
						t.Errorf("rank %d sent %d bytes to rank %d, want %d", from, got, to, wantSent[from][to])
					}
				}
			}
			for _, r := range c.receivers {
				feeders := 0
				for h := range c.p {
					if sent[h][r].Load() > 0 {
						feeders++
					}
				}
				if wantK := min(c.k, len(c.holders), max(1, c.count*esz/cfg.ChunkBytes)); c.k > 0 && feeders != wantK {
					t.Errorf("receiver %d fed by %d holders, want %d", r, feeders, wantK)
				}
			}
		})
	}
}

// TestReplicateAcrossHosts: with the automatic k, receivers take their
// stripes from holders on their own host when there are some, else one per
// other host, over the hosts' real links (shared memory inside a host).
func TestReplicateAcrossHosts(t *testing.T) {
	for _, tc := range []struct {
		layout             hostLayout
		holders, receivers []int
	}{
		{blocked(3, 3), []int{0, 1, 3}, []int{2, 4, 5}},
		{blocked(2, 2, 2), []int{0, 1, 2, 3}, []int{4, 5}},
		{interleaved(3, 2, 1), []int{0, 2, 3, 5}, []int{1, 4}},
	} {
		t.Run(tc.layout.name, func(t *testing.T) {
			comms := newHostWorld(t, hostsMesh, tc.layout, Config{ChunkBytes: 4096, AbortTimeout: time.Second})
			want := make([]byte, 3<<20+12)
			for i := range want {
				want[i] = byte(i ^ i>>9)
			}
			bufs := make([][]byte, len(comms))
			for r := range bufs {
				if slices.Contains(tc.holders, r) {
					bufs[r] = bytes.Clone(want)
				} else {
					bufs[r] = make([]byte, len(want))
				}
			}
			noErrors(t, onAll(t, comms, 30*time.Second, func(ctx context.Context, cm *Communicator) error {
				return cm.Replicate(ctx, HostBuffer(Float32, bufs[cm.Rank()]), tc.holders, tc.receivers)
			}))
			for _, r := range tc.receivers {
				if !bytes.Equal(bufs[r], want) {
					t.Errorf("receiver %d: bytes differ from the holders'", r)
				}
			}
		})
	}
}

// dyingLink closes every link of its rank once it has sent after frames
// on it: the rank dies part-way through a transfer.
type dyingLink struct {
	transport.Link
	after *atomic.Int64
	all   []transport.Link
}

func (l dyingLink) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	if l.after.Add(-1) < 0 {
		for _, o := range l.all {
			if o != nil {
				o.Close()
			}
		}
	}
	return l.Link.Send(ctx, h, payload)
}

// TestReplicateHolderDies: a holder that dies mid-transfer fails its
// receiver with a *PeerError naming it, within bounded time. The other
// holders finish (their stripes may all fit in the links' buffers before
// the receiver gives up) or get a typed failure, never a hang.
func TestReplicateHolderDies(t *testing.T) {
	for _, m := range testMeshes {
		for _, victim := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s/victim=%d", m.name, victim), func(t *testing.T) {
				const p, receiver = 4, 3
				holders := []int{0, 1, 2}
				mk := func(t testing.TB, w transport.World) [][]transport.Link {
					mesh := m.mk(t, w)
					var left atomic.Int64
					left.Store(5)
					all := slices.Clone(mesh[victim])
					for q, l := range mesh[victim] {
						if l != nil {
							mesh[victim][q] = dyingLink{Link: l, after: &left, all: all}
						}
					}
					return mesh
				}
				comms := newWorld(t, mk, p, Config{ChunkBytes: 4096, StripeSources: 3, AbortTimeout: time.Second})
				start := time.Now()
				errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
					b := make([]byte, 1<<20)
					return c.Replicate(ctx, HostBuffer(Float32, b), holders, []int{receiver})
				})
				var pe *PeerError
				if !errors.As(errs[receiver], &pe) || pe.Rank != victim {
					t.Fatalf("receiver: want a PeerError naming rank %d, got %v", victim, errs[receiver])
				}
				for _, r := range holders {
					if r != victim && errs[r] != nil && !isTypedFailure(errs[r]) {
						t.Errorf("holder %d: want a typed failure, got %v", r, errs[r])
					}
				}
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("failing took %v", d)
				}
			})
		}
	}
}

// TestReplicateMismatchedSets: a rank passing other holders than its peers
// gets a *MismatchError (the plans' digest differs) rather than bytes put
// in the wrong place.
func TestReplicateMismatchedSets(t *testing.T) {
	comms := newWorld(t, tcpMesh, 3, Config{ChunkBytes: 64, AbortTimeout: time.Second})
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		holders := []int{0, 1}
		if c.Rank() == 2 {
			holders = []int{0}
		}
		return c.Replicate(ctx, HostBuffer(Float32, make([]byte, 4096)), holders, []int{2})
	})
	var me *MismatchError
	if !errors.As(errs[2], &me) || me.Field != "layout" {
		t.Fatalf("receiver: want a layout MismatchError, got %v", errs[2])
	}
}

// TestReplicateBadSets: sets no plan can come from are refused before
// anything is sent, and the communicator stays usable.
func TestReplicateBadSets(t *testing.T) {
	comms := newWorld(t, inprocMesh, 3, DefaultConfig())
	for _, tc := range []struct {
		name               string
		holders, receivers []int
	}{
		{"out of range", []int{0, 3}, []int{1}},
		{"negative", []int{-1}, []int{1}},
		{"unsorted", []int{1, 0}, []int{2}},
		{"repeated", []int{0, 0}, []int{2}},
		{"overlap", []int{0, 1}, []int{1, 2}},
		{"no holder", nil, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
				return c.Replicate(ctx, HostBuffer(Float32, make([]byte, 16)), tc.holders, tc.receivers)
			})
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d: accepted holders %v receivers %v", r, tc.holders, tc.receivers)
				}
			}
		})
	}
	noErrors(t, onAll(t, comms, 5*time.Second, func(ctx context.Context, c *Communicator) error {
		b := make([]float32, 4)
		return c.Allreduce(ctx, SliceBuffer(b), SliceBuffer(b), Sum)
	}))
}

// TestReplicateDeviceMemory: holders and receivers whose buffers are in
// device memory stage the stripes through host bytes, and the receivers end
// with the holders' bytes.
func TestReplicateDeviceMemory(t *testing.T) {
	const p, n = 5, 3001
	holders, receivers := []int{0, 2, 3}, []int{1, 4}
	comms := newWorld(t, tcpMesh, p, Config{ChunkBytes: 256, StripeSources: 3, AbortTimeout: time.Second})
	want := make([]byte, n*4)
	for i := range want {
		want[i] = byte(i*13 + 5)
	}
	var calls atomic.Int64
	devs := make([]*fakeDevice, p)
	for r := range devs {
		b := make([]byte, len(want))
		if slices.Contains(holders, r) {
			copy(b, want)
		}
		devs[r] = newFakeDevice(b, &calls)
	}
	noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		return c.Replicate(ctx, devBuffer(Float32, devs[c.Rank()]), holders, receivers)
	}))
	for _, r := range receivers {
		if !bytes.Equal(devs[r].mem, want) {
			t.Errorf("receiver %d: device bytes differ from the holders'", r)
		}
	}
}
