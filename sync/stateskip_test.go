package sync

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/inproc"
	"github.com/gorovod/gorovod/internal/testing/fakedevice"
)

// rankState is one rank's side of a world being entered, for stateRoot.
type rankState struct {
	synced bool
	step   int64
	params []float32
	blob   []byte
	device bool // the tensor is in device memory (no digest from the host)
}

// A world whose members all hold the job's state, the same to the byte,
// needs no broadcast; any difference, a member without the state, or a
// state that cannot be read from the host makes it take the lowest rank's
// that holds it, and every rank learns which members hold that state
// already (the holders, who feed the others).
func TestStateRootSkipsIdenticalState(t *testing.T) {
	same := func(n int) []rankState {
		rs := make([]rankState, n)
		for i := range rs {
			rs[i] = rankState{synced: true, step: 7, params: []float32{1, 2, 3}, blob: []byte("sampler at 40")}
		}
		return rs
	}
	for _, tc := range []struct {
		name        string
		ranks       []rankState
		edit        func([]rankState)
		wantRoot    int
		wantSame    bool
		wantHolders []int
	}{
		{"all the same", same(3), nil, 0, true, []int{0, 1, 2}},
		{"two the same", same(2), nil, 0, true, []int{0, 1}},
		{"one alone", same(1), nil, 0, true, []int{0}},
		{"a parameter differs", same(3), func(rs []rankState) { rs[2].params[1] = 2.5 }, 0, false, []int{0, 1}},
		{"a step differs", same(3), func(rs []rankState) { rs[1].step = 8 }, 0, false, []int{0, 2}},
		{"a blob differs", same(3), func(rs []rankState) { rs[0].blob = []byte("sampler at 41") }, 0, false, []int{0}},
		{"a joiner", same(3), func(rs []rankState) { rs[2].synced = false }, 0, false, []int{0, 1}},
		{"joiners", same(5), func(rs []rankState) { rs[1].synced, rs[4].synced = false, false }, 0, false, []int{0, 2, 3}},
		{"rank 0 never synced", same(3), func(rs []rankState) { rs[0].synced = false }, 1, false, []int{1, 2}},
		{"a new job", same(3), func(rs []rankState) {
			for i := range rs {
				rs[i].synced = false
			}
		}, 0, false, nil},
		{"nine the same", same(9), nil, 0, true, []int{0, 1, 2, 3, 4, 5, 6, 7, 8}},
		{"nine, one behind", same(9), func(rs []rankState) { rs[6].step = 6 }, 0, false, []int{0, 1, 2, 3, 4, 5, 7, 8}},
		{"state in device memory", same(3), func(rs []rankState) { rs[1].device = true }, 0, false, []int{0, 2}},
		{"root's state in device memory", same(3), func(rs []rankState) { rs[0].device = true }, 0, false, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.edit != nil {
				tc.edit(tc.ranks)
			}
			p := len(tc.ranks)
			w := transport.World{JobID: "state-skip", Epoch: 1, Addrs: make([]string, p)}
			mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: 5 * time.Second}, p)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type result struct {
				root    int
				same    bool
				holders []int
				local   *stateDigest
				err     error
			}
			results := make([]result, p)
			ops := make([]opRecorder, p)
			var wg stdsync.WaitGroup
			for r, rs := range tc.ranks {
				w.Rank = r
				ccfg := collective.DefaultConfig()
				ccfg.Tracer = &ops[r]
				comm, err := collective.NewFromLinks(w, mesh[r], ccfg)
				if err != nil {
					t.Fatal(err)
				}
				defer comm.Close()
				st := NewState()
				st.Step = rs.step
				if rs.device {
					st.RegisterBuffer("params", fakedevice.New(make([]byte, 4*len(rs.params)), nil).Buffer(collective.Float32))
				} else {
					st.RegisterTensor("params", rs.params)
				}
				blob := rs.blob
				st.RegisterBlob("sampler", func() ([]byte, error) { return blob, nil }, func([]byte) error { return nil })
				s := &Session{synced: rs.synced, state: st, log: slog.New(slog.DiscardHandler)}
				wg.Go(func() {
					root, local, holders, same, err := s.stateRoot(ctx, comm)
					results[r] = result{root, same, holders, local, err}
				})
			}
			wg.Wait()
			for r, res := range results {
				if res.err != nil {
					t.Fatalf("rank %d: %v", r, res.err)
				}
				if res.root != tc.wantRoot || res.same != tc.wantSame || !slices.Equal(res.holders, tc.wantHolders) {
					t.Fatalf("rank %d: root %d, same %v, holders %v; want root %d, same %v, holders %v",
						r, res.root, res.same, res.holders, tc.wantRoot, tc.wantSame, tc.wantHolders)
				}
				// The agreement is one collective of few rounds: an
				// allreduce by recursive doubling, not a ring allgather
				// (p-1 steps, one after the other).
				if p > 1 && (len(ops[r].ops) != 1 || ops[r].ops[0] != "allreduce/recursive-doubling") {
					t.Fatalf("rank %d agreed on the state with %v, want one allreduce/recursive-doubling", r, ops[r].ops)
				}
				// A digest read the blobs: the broadcast reuses them.
				if read := res.local.readBlobs(); read != nil && string(read[0]) != string(tc.ranks[r].blob) {
					t.Fatalf("rank %d: blobs read %q", r, read)
				}
				gotWhole := res.local.readBlobs() != nil
				if want := p > 1 && tc.ranks[r].synced && !tc.ranks[r].device; gotWhole != want {
					t.Fatalf("rank %d: took the whole state's digest: %v, want %v", r, gotWhole, want)
				}
				// Every member of a larger world took its tensors' digests,
				// for the transfer that follows.
				if p > 1 && (res.local == nil || len(res.local.tensors) != 1 || (res.local.tensors[0] == noDigest) != tc.ranks[r].device) {
					t.Fatalf("rank %d: tensor digests %+v", r, res.local)
				}
			}
		})
	}
}

// opRecorder is a collective.Tracer that lists the collectives a rank ran,
// as collective/algorithm.
type opRecorder struct {
	mu  stdsync.Mutex
	ops []string
}

func (o *opRecorder) CollectiveStart(op collective.OpInfo, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops = append(o.ops, op.Collective+"/"+op.Algorithm)
}

func (*opRecorder) CollectivePhase(collective.OpInfo, collective.PhaseInfo) {}

func (*opRecorder) CollectiveEnd(collective.OpInfo, time.Time, time.Time, error) {}

// differing tells every rank alike which tensors some rank holds
// differently: a tensor the same everywhere is left out, one that differs
// on any rank or that some rank holds in device memory (no digest from the
// host) is sent.
func TestDifferingTensors(t *testing.T) {
	const p = 3
	type tensor struct {
		values   []float32 // every rank's
		edit     int       // the rank whose copy differs (-1: none)
		onDevice int       // the rank that holds it in device memory (-1: none)
	}
	for _, tc := range []struct {
		name    string
		tensors []tensor
		want    []bool
	}{
		{"none", nil, nil},
		{"all the same", []tensor{{[]float32{1, 2}, -1, -1}, {[]float32{3}, -1, -1}}, []bool{false, false}},
		{"one differs on one rank", []tensor{{[]float32{1, 2}, -1, -1}, {[]float32{3}, 2, -1}, {[]float32{4, 5, 6}, -1, -1}}, []bool{false, true, false}},
		{"differs on rank 0", []tensor{{[]float32{1, 2}, 0, -1}}, []bool{true}},
		{"in device memory on one rank", []tensor{{[]float32{1, 2}, -1, 1}, {[]float32{7}, -1, -1}}, []bool{true, false}},
		{"in device memory on the last rank", []tensor{{[]float32{1, 2}, -1, 2}}, []bool{true}},
		{"empty", []tensor{{[]float32{}, -1, -1}}, []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := transport.World{JobID: "differing", Epoch: 1, Addrs: make([]string, p)}
			mesh := inproc.Mesh(inproc.Config{JobID: w.JobID, Epoch: w.Epoch, IOTimeout: 5 * time.Second}, p)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := make([][]bool, p)
			errs := make([]error, p)
			var wg stdsync.WaitGroup
			for r := range p {
				w.Rank = r
				comm, err := collective.NewFromLinks(w, mesh[r], collective.DefaultConfig())
				if err != nil {
					t.Fatal(err)
				}
				defer comm.Close()
				st := NewState()
				for i, tn := range tc.tensors {
					values := slices.Clone(tn.values)
					if r == tn.edit {
						values[0]++
					}
					name := fmt.Sprintf("t%d", i)
					if r == tn.onDevice {
						st.RegisterBuffer(name, fakedevice.New(make([]byte, 4*len(values)), nil).Buffer(collective.Float32))
					} else {
						st.RegisterTensor(name, values)
					}
				}
				// Half the ranks pass the digests they took on entering
				// (Session.stateRoot), the others none.
				var local *stateDigest
				if r%2 == 0 {
					local = &stateDigest{tensors: st.tensorDigests()}
				}
				wg.Go(func() { got[r], errs[r] = st.differing(ctx, comm, local) })
			}
			wg.Wait()
			for r := range p {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if !slices.Equal(got[r], tc.want) {
					t.Fatalf("rank %d: differing %v, want %v", r, got[r], tc.want)
				}
			}
		})
	}
}
