package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	// Pipelined: pieces of 12 bytes cut 7 to 1001 elements of 2 to 8
	// bytes into 2 to 64 pieces with remainders (Uint8 of up to 23
	// elements, and the smallest counts, stay in one piece), some pieces
	// smaller than the host's stripes.
	{"hier-pieces-ring", Config{Algorithm: AlgorithmHierarchical, SmallMessageBytes: -1, ChunkBytes: 64, HierarchicalPieceBytes: 12, AbortTimeout: time.Second}},
	{"hier-pieces-rd", Config{Algorithm: AlgorithmHierarchical, SmallMessageBytes: 1 << 30, ChunkBytes: 64, HierarchicalPieceBytes: 12, AbortTimeout: time.Second}},
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
		for _, alg := range []Algorithm{AlgorithmRing, AlgorithmHierarchical, AlgorithmRecursiveDoubling, "hierarchical-pieces"} {
			t.Run(l.name+"/"+string(alg), func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Algorithm = alg
				if alg == "hierarchical-pieces" {
					// 1 MiB+13 bytes: the 4 and 6 MiB buffers run as 3
					// and 5 pieces with remainders.
					cfg.Algorithm, cfg.HierarchicalPieceBytes = AlgorithmHierarchical, 1<<20+13
				}
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
		layout     hostLayout
		alg        Algorithm
		bytes      int
		want       string
		phases     string
		pieceBytes int // Config.HierarchicalPieceBytes; 0: the default
	}{
		// Pipelined (4 pieces): each phase is reported once.
		{blocked(2, 2), AlgorithmAuto, 4 * hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather", hier},
		{blocked(1, 3), AlgorithmHierarchical, 4 * hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather", hier},
		{blocked(2, 2), AlgorithmAuto, 4, "recursive-doubling", "", 0},
		{blocked(2, 2), AlgorithmAuto, small, "recursive-doubling", "", 0},
		{blocked(2, 2), AlgorithmAuto, small + 4, "ring", "reduce-scatter allgather", 0},
		{blocked(2, 2), AlgorithmAuto, hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather", 0},
		{blocked(1, 3), AlgorithmAuto, hier, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather", 0},
		{blocked(4), AlgorithmAuto, hier, "ring", "reduce-scatter allgather", 0},
		{blocked(1, 1, 1), AlgorithmAuto, hier, "ring", "reduce-scatter allgather", 0},
		{blocked(2, 2), AlgorithmRing, hier, "ring", "reduce-scatter allgather", 0},
		{blocked(2, 2), AlgorithmRing, 4, "ring", "reduce-scatter allgather", 0},
		{blocked(2, 2), AlgorithmHierarchical, 4, "hierarchical", "local-reduce-scatter cross-allreduce local-allgather", 0},
		{blocked(2, 2), AlgorithmRecursiveDoubling, 1 << 20, "recursive-doubling", "", 0},
	} {
		t.Run(fmt.Sprintf("%s/%s/%d", tc.layout.name, tc.alg, tc.bytes), func(t *testing.T) {
			rec := &recordTracer{}
			cfg := Config{Algorithm: tc.alg, SmallMessageBytes: small, HierarchicalBytes: hier, HierarchicalPieceBytes: tc.pieceBytes, AbortTimeout: time.Second}
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
					// The default pieces, and pieces of 96 KiB: the
					// 1 MiB allreduce pipelined in 10 of them.
					for _, pieceBytes := range []int{0, 96 << 10} {
						t.Run(fmt.Sprintf("%s/%s/%dKiB/%s/pieces%d", m.name, l.name, size>>10, coll.name, pieceBytes), func(t *testing.T) {
							cfg := DefaultConfig()
							cfg.Algorithm, cfg.AllgatherAlgorithm = AlgorithmHierarchical, AlgorithmHierarchical
							if pieceBytes != 0 {
								cfg.HierarchicalPieceBytes = pieceBytes
							}
							checkSteadyAllocs(t, newHostWorld(t, m.mk, l, cfg), size, coll.run)
						})
					}
				}
			}
		}
	}
}

// phaseTracer keeps the phases of every collective with their times.
type phaseTracer struct {
	mu     sync.Mutex
	phases []PhaseInfo
}

func (r *phaseTracer) CollectiveStart(OpInfo, time.Time) {}

func (r *phaseTracer) CollectivePhase(_ OpInfo, ph PhaseInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, ph)
}

func (r *phaseTracer) CollectiveEnd(OpInfo, time.Time, time.Time, error) {}

// TestHierarchicalPipelineOverlaps: cut into pieces, the hierarchical
// allreduce runs the cross-host allreduce while the host still
// reduce-scatters and allgathers: on a rank that carries a stripe, the
// cross phase starts before the local reduce-scatter ends, and the local
// allgather starts before the cross phase ends (with 3 pieces or more the
// order of the pieces guarantees it). Unpipelined, each phase starts after
// the one before ends.
func TestHierarchicalPipelineOverlaps(t *testing.T) {
	for _, tc := range []struct {
		layout hostLayout
		pieces int
	}{
		{blocked(2, 2), 3},
		{blocked(2, 2), 8},
		{blocked(3, 2), 5},
		{blocked(2, 2, 2), 4},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.layout.name, tc.pieces), func(t *testing.T) {
			const bytes = 96 << 10
			rec := &phaseTracer{}
			cfg := Config{Algorithm: AlgorithmHierarchical, ChunkBytes: 4096, HierarchicalPieceBytes: bytes / tc.pieces, AbortTimeout: time.Second}
			comms := newHostWorld(t, inprocMesh, tc.layout, cfg)
			comms[0].tracer = rec
			noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
				b := HostBuffer(Float32, make([]byte, bytes))
				return c.Allreduce(ctx, b, b, Sum)
			}))
			if len(rec.phases) != 3 {
				t.Fatalf("%d phases reported, want 3", len(rec.phases))
			}
			rs, cross, ag := rec.phases[0], rec.phases[1], rec.phases[2]
			if !cross.Start.Before(rs.End) {
				t.Errorf("the cross allreduce started %v after the local reduce-scatter ended", cross.Start.Sub(rs.End))
			}
			if !ag.Start.Before(cross.End) {
				t.Errorf("the local allgather started %v after the cross allreduce ended", ag.Start.Sub(cross.End))
			}
		})
	}
}

// TestHierarchicalPipelineFailures: a pipelined hierarchical allreduce
// fails every rank with a typed error within bounded time, never a hang,
// when a rank dies part-way (its links closed after some frames: a rank
// with a stripe and one without, inside the host and across), when a rank
// never joins (the others' deadline), and when ranks cut the buffer into
// different pieces (a mismatch). A dead rank is named by a *PeerError or a
// mismatch; an absent one leaves the others their deadline; the rank with
// other pieces by a mismatch, or by a *PeerError when it found the mismatch
// first and closed its links.
func TestHierarchicalPipelineFailures(t *testing.T) {
	const bytes = 256 << 10
	cfg := Config{Algorithm: AlgorithmHierarchical, SmallMessageBytes: -1, ChunkBytes: 4096, HierarchicalPieceBytes: 32 << 10, AbortTimeout: time.Second}
	for _, m := range []struct {
		name string
		mk   meshFunc
	}{{"inproc", inprocMesh}, {"hosts", hostsMesh}} {
		for _, tc := range []struct {
			name   string
			layout hostLayout
			victim int
			frames int64 // the victim's sends before it dies; -1: it never joins
			pieces int   // the victim's HierarchicalPieceBytes, when not 0
		}{
			{"dies/stripe", blocked(2, 2), 2, 40, 0},
			{"dies/local-only", blocked(2, 3), 4, 20, 0},
			{"dies/early", blocked(2, 2), 1, 3, 0},
			{"dies/uneven", blocked(3, 2), 0, 60, 0},
			{"absent", blocked(2, 2), 3, -1, 0},
			{"other-pieces", blocked(2, 2), 1, 0, 64 << 10},
		} {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				mk := func(t testing.TB, w transport.World) [][]transport.Link {
					mesh := m.mk(t, w)
					if tc.frames <= 0 {
						return mesh
					}
					var left atomic.Int64
					left.Store(tc.frames)
					all := slices.Clone(mesh[tc.victim])
					for q, l := range mesh[tc.victim] {
						if l != nil {
							mesh[tc.victim][q] = dyingLink{Link: l, after: &left, all: all}
						}
					}
					return mesh
				}
				p := len(tc.layout.hosts)
				w := transport.World{JobID: "test-job", Epoch: 1, Addrs: make([]string, p), Hosts: tc.layout.hosts}
				mesh := mk(t, w)
				comms := make([]*Communicator, p)
				for r := range comms {
					w.Rank = r
					rcfg := cfg
					if r == tc.victim && tc.pieces != 0 {
						rcfg.HierarchicalPieceBytes = tc.pieces
					}
					c, err := NewFromLinks(w, mesh[r], rcfg)
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
					defer c.Close()
					comms[r] = c
				}
				timeout := 20 * time.Second
				if tc.frames < 0 {
					timeout = 500 * time.Millisecond
				}
				start := time.Now()
				errs := onAll(t, comms, timeout, func(ctx context.Context, c *Communicator) error {
					if tc.frames < 0 && c.Rank() == tc.victim {
						return nil
					}
					b := HostBuffer(Float32, make([]byte, bytes))
					return c.Allreduce(ctx, b, b, Sum)
				})
				if d := time.Since(start); d > 15*time.Second {
					t.Errorf("failing took %v", d)
				}
				named := false
				if tc.pieces != 0 {
					// The victim took part: it fails too, with a mismatch
					// of layout when it is the one that found it.
					var mm *MismatchError
					if err := errs[tc.victim]; !isTypedFailure(err) {
						t.Errorf("rank %d (victim): want a typed failure, got %v", tc.victim, err)
					} else if errors.As(err, &mm) && mm.Field != "layout" {
						t.Errorf("rank %d (victim): mismatch of %s, want layout", tc.victim, mm.Field)
					}
				}
				for r, err := range errs {
					if r == tc.victim {
						continue
					}
					if tc.frames < 0 && errors.Is(err, context.DeadlineExceeded) {
						// Ranks not waiting on the absent one directly see
						// their deadline (as unpipelined).
						var pe *PeerError
						named = named || (errors.As(err, &pe) && pe.Rank == tc.victim)
						continue
					}
					if !isTypedFailure(err) {
						t.Fatalf("rank %d: want a typed failure, got %v", r, err)
					}
					var pe *PeerError
					var mm *MismatchError
					switch {
					case tc.frames < 0:
						// A rank that waits on the absent one hits its
						// deadline and aborts the communicator; the abort
						// can reach another rank before that rank's own
						// deadline: a typed failure as good as it.
						named = named || (errors.As(err, &pe) && pe.Rank == tc.victim)
					case tc.pieces != 0:
						if errors.As(err, &mm) {
							named = named || mm.Peer == tc.victim
							if mm.Peer == tc.victim && mm.Field != "layout" {
								t.Errorf("rank %d: mismatch of %s, want layout", r, mm.Field)
							}
						}
						// The victim may find the mismatch first: it then
						// aborts with pieces of its own still in flight,
						// closing those links part-way through a frame, and
						// its peers see only that it closed them.
						named = named || (errors.As(err, &pe) && pe.Rank == tc.victim)
					default:
						if errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("rank %d: the deadline, not the dead peer: %v", r, err)
						}
						named = named || (errors.As(err, &pe) && pe.Rank == tc.victim)
					}
				}
				if !named && tc.frames >= 0 {
					t.Errorf("no rank named rank %d: %v", tc.victim, errs)
				}
			})
		}
	}
}
