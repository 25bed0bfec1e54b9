package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

// hostLayout declares on which simulated host each rank of a test world runs.
type hostLayout struct {
	name  string
	hosts []string // host name of each rank
}

// blocked lays out hosts with the given rank counts, each host's ranks
// consecutive (as launchers number them).
func blocked(sizes ...int) hostLayout {
	var hs []string
	for h, n := range sizes {
		for range n {
			hs = append(hs, fmt.Sprintf("h%d", h))
		}
	}
	return hostLayout{name: fmt.Sprintf("blocked%v", sizes), hosts: hs}
}

// interleaved lays out hosts with the given rank counts dealt round-robin,
// so that no host's ranks are consecutive: the ring must reorder them.
func interleaved(sizes ...int) hostLayout {
	left := append([]int(nil), sizes...)
	var hs []string
	for more := true; more; {
		more = false
		for h := range left {
			if left[h] > 0 {
				hs = append(hs, fmt.Sprintf("h%d", h))
				left[h]--
				more = true
			}
		}
	}
	return hostLayout{name: fmt.Sprintf("interleaved%v", sizes), hosts: hs}
}

// hostsSet is the set of hosts l names.
func (l hostLayout) hostsSet() map[string]bool {
	m := map[string]bool{}
	for _, h := range l.hosts {
		m[h] = true
	}
	return m
}

// testLayouts: 1 to 4 hosts of 1 to 3 ranks, even and uneven.
var testLayouts = []hostLayout{
	blocked(1), blocked(3), blocked(1, 1), blocked(2, 2), blocked(1, 3), blocked(3, 1),
	interleaved(2, 2), interleaved(3, 2, 1), blocked(2, 2, 2, 2), interleaved(1, 2, 3, 1),
}

// newHostWorld returns communicators for a world laid out as l, over mk's
// links, the hosts declared in the world.
func newHostWorld(t testing.TB, mk meshFunc, l hostLayout, cfg Config) []*Communicator {
	t.Helper()
	p := len(l.hosts)
	w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, p), Hosts: l.hosts}
	mesh := mk(t, w)
	comms := make([]*Communicator, p)
	for r := range comms {
		w.Rank = r
		c, err := NewFromLinks(w, mesh[r], cfg)
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		comms[r] = c
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// hostsMesh connects a world over the shared-memory transport with each
// rank's host identity set to its declared host (w.Hosts), so that, as on
// real hosts, ranks of one declared host share memory and the others talk
// over TCP (the transport's fallback).
func hostsMesh(t testing.TB, w transport.World) [][]transport.Link {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport is Linux-only")
	}
	p := w.Size()
	ts := make([]transport.Transport, p)
	addrs := make([]string, p)
	for r := range ts {
		cfg := shm.DefaultConfig()
		cfg.Secret = []byte("collective-test-secret")
		cfg.IOTimeout = 10 * time.Second
		cfg.RingBytes = 256 << 10 // keep /dev/shm use low
		cfg.HostID, cfg.Fallback = "test-host-"+w.Hosts[r], true
		tr, err := shm.Listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		ts[r], addrs[r] = tr, tr.Addr()
	}
	mesh := make([][]transport.Link, p)
	errs := make([]error, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range ts {
		wg.Go(func() {
			wr := w
			wr.Rank, wr.Addrs = r, addrs
			mesh[r], errs[r] = ts[r].Connect(ctx, wr)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d connect: %v", r, err)
		}
	}
	// The declared hosts decide the transport of every pair.
	for r, links := range mesh {
		for q, l := range links {
			if l == nil {
				continue
			}
			shared := strings.Contains(fmt.Sprintf("%T", l), "shm.")
			if same := w.Hosts[r] == w.Hosts[q]; shared != same {
				t.Fatalf("ranks %d (%s) and %d (%s): link %T", r, w.Hosts[r], q, w.Hosts[q], l)
			}
		}
	}
	return mesh
}

func TestTopology(t *testing.T) {
	for _, tc := range []struct {
		hosts                []string
		rank                 int
		want                 Topology
		flat                 []int
		cross                []int
		minLocal, numHosts   int
		uniform, hierarchial bool
	}{
		{hosts: []string{"a", "b", "a", "b"}, rank: 2,
			want: Topology{Hosts: []int{0, 1, 0, 1}, HostRanks: [][]int{{0, 2}, {1, 3}}, LocalRank: 1, LocalSize: 2, CrossRank: 0, CrossSize: 2},
			flat: []int{0, 2, 1, 3}, cross: []int{2, 3}, minLocal: 2, numHosts: 2, uniform: true, hierarchial: true},
		{hosts: []string{"a", "b", "b", "b"}, rank: 3,
			want: Topology{Hosts: []int{0, 1, 1, 1}, HostRanks: [][]int{{0}, {1, 2, 3}}, LocalRank: 2, LocalSize: 3, CrossRank: 0, CrossSize: 1},
			flat: []int{0, 1, 2, 3}, cross: nil, minLocal: 1, numHosts: 2, hierarchial: true},
		{hosts: []string{"x", "y", "z"}, rank: 1,
			want: Topology{Hosts: []int{0, 1, 2}, HostRanks: [][]int{{0}, {1}, {2}}, LocalRank: 0, LocalSize: 1, CrossRank: 1, CrossSize: 3},
			flat: []int{0, 1, 2}, cross: []int{0, 1, 2}, minLocal: 1, numHosts: 3, uniform: true},
	} {
		w := transport.World{JobID: "j", Rank: tc.rank, Addrs: make([]string, len(tc.hosts)), Hosts: tc.hosts}
		got := topologyOf(w)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%v rank %d: topology %+v, want %+v", tc.hosts, tc.rank, got, tc.want)
		}
		g := newGroups(got, tc.rank)
		if fmt.Sprint(g.flat.ranks) != fmt.Sprint(tc.flat) || g.flat.ranks[g.flat.pos] != tc.rank {
			t.Errorf("%v: flat ring %v at %d, want %v", tc.hosts, g.flat.ranks, g.flat.pos, tc.flat)
		}
		if fmt.Sprint(g.cross.ranks) != fmt.Sprint(tc.cross) || g.minLocal != tc.minLocal {
			t.Errorf("%v: cross %v (min local %d), want %v (%d)", tc.hosts, g.cross.ranks, g.minLocal, tc.cross, tc.minLocal)
		}
		if got.NumHosts() != tc.numHosts || got.Uniform() != tc.uniform || got.hierarchical() != tc.hierarchial {
			t.Errorf("%v: hosts %d uniform %v hierarchical %v", tc.hosts, got.NumHosts(), got.Uniform(), got.hierarchical())
		}
	}
	// Without declared hosts, the host part of each address decides.
	w := transport.World{JobID: "j", Rank: 0, Addrs: []string{"198.18.0.1:5000", "198.18.0.2:5000", "198.18.0.1:5001", "[::1]:7"}}
	if got := topologyOf(w); fmt.Sprint(got.Hosts) != "[0 1 0 2]" {
		t.Errorf("hosts from addresses: %v", got.Hosts)
	}
	if err := (transport.World{JobID: "j", Addrs: []string{"a", "b"}, Hosts: []string{"h"}}).Validate(); err == nil {
		t.Error("a world naming the hosts of 1 of 2 ranks is valid")
	}
}

// forcedConfigs force each allreduce algorithm, with tiny chunks so that
// every pipelining boundary is crossed, and with the cross-host part of the
// hierarchy both as a ring and as recursive doubling.
var forcedConfigs = []struct {
	name string
	cfg  Config
}{
	{"ring", Config{Algorithm: AlgorithmRing, SmallMessageBytes: -1, ChunkBytes: 64, AbortTimeout: time.Second}},
	{"rd", Config{Algorithm: AlgorithmRecursiveDoubling, ChunkBytes: 64, AbortTimeout: time.Second}},
	{"hier-ring", Config{Algorithm: AlgorithmHierarchical, SmallMessageBytes: -1, ChunkBytes: 64, AbortTimeout: time.Second}},
	{"hier-rd", Config{Algorithm: AlgorithmHierarchical, SmallMessageBytes: 1 << 30, ChunkBytes: 64, AbortTimeout: time.Second}},
	{"auto", Config{HierarchicalBytes: 1, SmallMessageBytes: 16, ChunkBytes: 64, AbortTimeout: time.Second}},
}

// TestAllreduceAlgorithms: every algorithm, forced, on every host layout,
// for every dtype and op and sizes from none to a few hundred elements,
// in place and not, agrees with the reference, bit-identical on every rank.
func TestAllreduceAlgorithms(t *testing.T) {
	for _, l := range testLayouts {
		for _, fc := range forcedConfigs {
			t.Run(l.name+"/"+fc.name, func(t *testing.T) {
				comms := newHostWorld(t, inprocMesh, l, fc.cfg)
				for _, dt := range allDTypes {
					for _, op := range allOps {
						for _, n := range []int{0, 1, 2, 7, 33, 1001} {
							checkAllreduce(t, comms, dt, op, n, n%2 == 1, 1, 1)
						}
					}
				}
				checkAllreduce(t, comms, Float32, Average, 37, false, 2, 0.5)
				checkAllreduce(t, comms, Int32, Average, 37, true, 3, 1)
			})
		}
	}
}

// TestAllreduceAlgorithmsOverHosts: the algorithms over shared memory inside
// each declared host and TCP between hosts, up to several MiB (with the
// default chunks), odd counts.
func TestAllreduceAlgorithmsOverHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("connects real transports")
	}
	for _, l := range []hostLayout{blocked(2, 2), interleaved(1, 3), blocked(2, 1, 2)} {
		for _, alg := range []Algorithm{AlgorithmRing, AlgorithmHierarchical, AlgorithmRecursiveDoubling} {
			t.Run(l.name+"/"+string(alg), func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Algorithm = alg
				comms := newHostWorld(t, hostsMesh, l, cfg)
				for _, n := range []int{0, 1, 5, 16<<10 + 3, 1<<20 + 1} {
					checkAllreduce(t, comms, Float32, Sum, n, true, 1, 1)
				}
				checkAllreduce(t, comms, BFloat16, Max, 3<<20+7, false, 1, 1)
			})
		}
	}
}

// TestAllgatherAlgorithms: the ring and the hierarchical allgather, equal
// and variable counts, on every host layout (the hierarchical one runs the
// ring where hosts are uneven).
func TestAllgatherAlgorithms(t *testing.T) {
	for _, l := range testLayouts {
		for _, alg := range []Algorithm{AlgorithmRing, AlgorithmHierarchical} {
			t.Run(l.name+"/"+string(alg), func(t *testing.T) {
				cfg := Config{AllgatherAlgorithm: alg, ChunkBytes: 64, AbortTimeout: time.Second}
				comms := newHostWorld(t, inprocMesh, l, cfg)
				for _, dt := range []DType{Float32, Float16, Int64, Uint8} {
					for _, n := range []int{0, 1, 3, 100} {
						checkAllgather(t, comms, dt, n, false)
						checkAllgather(t, comms, dt, n, true)
					}
				}
			})
		}
	}
}

// checkAllgather runs an allgather (variable: with per-rank counts) and
// compares every rank's result with the concatenation of the inputs.
func checkAllgather(t *testing.T, comms []*Communicator, dt DType, n int, variable bool) {
	t.Helper()
	p := len(comms)
	counts := make([]int, p)
	var want []byte
	parts := make([][]byte, p)
	for r := range p {
		counts[r] = n
		if variable {
			counts[r] = (n + r*5) % (n + 3)
		}
		parts[r] = encode(dt, inputs(dt, Sum, p, counts[r])[r])
		want = append(want, parts[r]...)
	}
	recvs := make([][]byte, p)
	errs := onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		r := c.Rank()
		recvs[r] = make([]byte, len(want))
		if variable {
			return c.AllgatherV(ctx, HostBuffer(dt, parts[r]), HostBuffer(dt, recvs[r]), counts)
		}
		return c.Allgather(ctx, HostBuffer(dt, parts[r]), HostBuffer(dt, recvs[r]))
	})
	for r := range p {
		if errs[r] != nil {
			t.Fatalf("allgather %v n=%d variable=%v: rank %d: %v", dt, n, variable, r, errs[r])
		}
		if !bytes.Equal(recvs[r], want) {
			t.Fatalf("allgather %v n=%d variable=%v: rank %d: wrong result", dt, n, variable, r)
		}
	}
}

// TestReduceScatterOverHosts: reduce-scatter runs the host-ordered ring, and
// each rank still gets its own segment.
func TestReduceScatterOverHosts(t *testing.T) {
	for _, l := range []hostLayout{interleaved(2, 2), interleaved(3, 2, 1)} {
		t.Run(l.name, func(t *testing.T) {
			comms := newHostWorld(t, inprocMesh, l, testConfigs[1].cfg)
			for _, dt := range []DType{Float32, Int32} {
				for _, n := range []int{0, 1, 7, 100} {
					checkReduceScatter(t, comms, dt, Sum, n, 2)
				}
			}
		})
	}
}

// recordTracer keeps the algorithm and phases of every collective.
type recordTracer struct {
	mu     sync.Mutex
	algos  []string
	phases []string
}

func (r *recordTracer) CollectiveStart(op OpInfo, _ time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.algos = append(r.algos, op.Collective+":"+op.Algorithm)
}

func (r *recordTracer) CollectivePhase(_ OpInfo, ph PhaseInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, ph.Phase.String())
}

func (r *recordTracer) CollectiveEnd(OpInfo, time.Time, time.Time, error) {}

// TestAlgorithmChoice: auto picks what the thresholds say, for the
// topology; a forced algorithm is run whatever the size; the tracer names
// the algorithm and the hierarchical phases.
func TestAlgorithmChoice(t *testing.T) {
	const small, hier = 1 << 10, 8 << 10
	for _, tc := range []struct {
		layout hostLayout
		alg    Algorithm
		bytes  int
		want   string
		phases string
	}{
		{blocked(2, 2), AlgorithmAuto, 4, "recursive-doubling", ""},
		{blocked(2, 2), AlgorithmAuto, small, "recursive-doubling", ""},
		{blocked(2, 2), AlgorithmAuto, small + 4, "ring", "reduce-scatter allgather"},
		{blocked(2, 2), AlgorithmAuto, hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather"},
		{blocked(1, 3), AlgorithmAuto, hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather"},
		{blocked(4), AlgorithmAuto, hier, "ring", "reduce-scatter allgather"},
		{blocked(1, 1, 1), AlgorithmAuto, hier, "ring", "reduce-scatter allgather"},
		{blocked(2, 2), AlgorithmRing, hier, "ring", "reduce-scatter allgather"},
		{blocked(2, 2), AlgorithmRing, 4, "ring", "reduce-scatter allgather"},
		{blocked(2, 2), AlgorithmHierarchical, 4, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather"},
		{blocked(2, 2), AlgorithmRecursiveDoubling, 1 << 20, "recursive-doubling", ""},
	} {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.layout.name, tc.alg, tc.bytes), func(t *testing.T) {
			rec := &recordTracer{}
			cfg := Config{Algorithm: tc.alg, SmallMessageBytes: small, HierarchicalBytes: hier, AbortTimeout: time.Second}
			comms := newHostWorld(t, inprocMesh, tc.layout, cfg)
			comms[0].tracer = rec
			noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				b := HostBuffer(Float32, make([]byte, tc.bytes))
				return c.Allreduce(ctx, b, b, Sum)
			}))
			if got := strings.Join(rec.algos, " "); got != "allreduce:"+tc.want {
				t.Errorf("ran %s, want allreduce:%s", got, tc.want)
			}
			if got := comms[0].AllreduceAlgorithm(Float32, tc.bytes/4); got != tc.want {
				t.Errorf("AllreduceAlgorithm says %s, want %s", got, tc.want)
			}
			if got := strings.Join(rec.phases, " "); got != tc.phases {
				t.Errorf("phases %q, want %q", got, tc.phases)
			}
		})
	}
	// Allgather: the ring unless the hierarchy is forced and the hosts even.
	for _, tc := range []struct {
		layout hostLayout
		alg    Algorithm
		want   string
	}{
		{blocked(2, 2), AlgorithmAuto, "ring"},
		{blocked(2, 2), AlgorithmHierarchical, "hierarchical"},
		{blocked(1, 3), AlgorithmHierarchical, "ring"},
		{blocked(3), AlgorithmHierarchical, "ring"},
	} {
		rec := &recordTracer{}
		comms := newHostWorld(t, inprocMesh, tc.layout, Config{AllgatherAlgorithm: tc.alg, AbortTimeout: time.Second})
		comms[0].tracer = rec
		noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
			return Allgather(ctx, c, make([]float32, 100), make([]float32, 100*c.Size()))
		}))
		if got := strings.Join(rec.algos, " "); got != "allgather:"+tc.want {
			t.Errorf("%s %s: ran %s, want allgather:%s", tc.layout.name, tc.alg, got, tc.want)
		}
		if got := comms[0].AllgatherAlgorithm(); got != tc.want {
			t.Errorf("%s %s: AllgatherAlgorithm says %s, want %s", tc.layout.name, tc.alg, got, tc.want)
		}
		if topo := comms[0].Topology(); topo.NumHosts() != len(tc.layout.hostsSet()) {
			t.Errorf("%s: Topology has %d hosts", tc.layout.name, topo.NumHosts())
		}
	}
}

// TestAlgorithmConfig: names parse, unknown ones are refused, and ranks
// that force different algorithms see a mismatch, not a misread.
func TestAlgorithmConfig(t *testing.T) {
	for in, want := range map[string]Algorithm{"": AlgorithmAuto, "Ring": AlgorithmRing, "rd": AlgorithmRecursiveDoubling, "hier": AlgorithmHierarchical, "hierarchical": AlgorithmHierarchical} {
		if got, err := ParseAlgorithm(in); err != nil || got != want {
			t.Errorf("ParseAlgorithm(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, cfg := range []Config{{Algorithm: "fastest"}, {AllgatherAlgorithm: "rd"}} {
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: Validate = %v", cfg, err)
		}
	}
	l := blocked(2, 2)
	p := len(l.hosts)
	w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, p), Hosts: l.hosts}
	mesh := inprocMesh(t, w)
	comms := make([]*Communicator, p)
	for r := range comms {
		w.Rank = r
		cfg := Config{Algorithm: AlgorithmRing, AbortTimeout: time.Second}
		if r == 1 {
			cfg.Algorithm = AlgorithmHierarchical
		}
		c, err := NewFromLinks(w, mesh[r], cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		comms[r] = c
	}
	errs := onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
		return Allreduce(ctx, c, make([]float32, 1<<16), make([]float32, 1<<16), Sum)
	})
	var mm *MismatchError
	for r, err := range errs {
		if !isTypedFailure(err) {
			t.Fatalf("rank %d: %v", r, err)
		}
		if errors.As(err, &mm) && !strings.Contains(mm.Field, "algorithm") {
			t.Errorf("rank %d: mismatch of %s", r, mm.Field)
		}
	}
	if mm == nil {
		t.Error("no rank reported a mismatch")
	}
}

// TestSteadyStateAllocationsHierarchical: the hierarchical allreduce (its
// cross part as a ring and as recursive doubling) and allgather allocate
// nothing once a communicator has run one of a shape, like the ring.
func TestSteadyStateAllocationsHierarchical(t *testing.T) {
	if testing.Short() {
		t.Skip("connects real transports")
	}
	for _, m := range []struct {
		name string
		mk   meshFunc
	}{{"inproc", inprocMesh}, {"hosts", hostsMesh}} {
		for _, l := range []hostLayout{blocked(2, 2), blocked(1, 2)} {
			for _, size := range []int{4 << 10, 1 << 20} {
				for _, coll := range steadyCollectives[:4] {
					if coll.name == "broadcast" {
						continue
					}
					t.Run(fmt.Sprintf("%s/%s/%dKiB/%s", m.name, l.name, size>>10, coll.name), func(t *testing.T) {
						cfg := DefaultConfig()
						cfg.Algorithm, cfg.AllgatherAlgorithm = AlgorithmHierarchical, AlgorithmHierarchical
						checkSteadyAllocs(t, newHostWorld(t, m.mk, l, cfg), size, coll.run)
					})
				}
			}
		}
	}
}
