package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
)

// countingLink counts the payload bytes a rank sends to its peer.
type countingLink struct {
	transport.Link
	sent *atomic.Int64
}

func (l countingLink) Send(ctx context.Context, h *transport.Header, payload []byte) error {
	l.sent.Add(int64(len(payload)))
	return l.Link.Send(ctx, h, payload)
}

// stripeRank is one rank's registrations for TestJoinersFedByHolders: the
// same names and shapes everywhere, contents that are the job's on the
// members and anything on the joiners.
type stripeRank struct {
	st      *State
	tensors [][]byte
	blob    []byte
}

func newStripeRank(synced bool, seed uint64, sizes []int, dts []collective.DType, step int64) *stripeRank {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := &stripeRank{st: NewState()}
	for i, n := range sizes {
		b := make([]byte, n*dts[i].Size())
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		x.tensors = append(x.tensors, b)
		x.st.RegisterBuffer(fmt.Sprintf("t%d", i), collective.HostBuffer(dts[i], b))
	}
	x.blob = []byte(fmt.Sprintf("sampler of seed %d", seed))
	x.st.RegisterBlob("sampler", func() ([]byte, error) { return x.blob, nil }, func(b []byte) error {
		x.blob = bytes.Clone(b)
		return nil
	})
	if synced {
		x.st.Step = step
	}
	return x
}

// enterState runs what Session.enter runs once connected: agree on the
// root and the holders, then transfer the state unless every member holds
// it.
func enterState(ctx context.Context, s *Session, comm *collective.Communicator) error {
	root, local, holders, same, err := s.stateRoot(ctx, comm)
	if err == nil && !same {
		_, err = s.state.broadcast(ctx, comm, root, local, holders)
	}
	return err
}

// TestJoinersFedByHolders enters worlds over real loopback sockets where
// some members hold the job's state and joiners (or a member whose state
// drifted) lack it: every rank ends with the holders' state bit for bit,
// and when the holders are at least as many as the ranks lacking it, each
// of those took its tensors from several holders (bytes counted on the
// links), while a holder received no tensor bytes. A tensor that the
// ranks lacking the state hold already, byte for byte (a joiner that
// loaded the job's checkpoint of a frozen layer), crosses no link.
func TestJoinersFedByHolders(t *testing.T) {
	sizes := []int{100003, 777, 1, 65536}
	dts := []collective.DType{collective.Float32, collective.Int64, collective.Float16, collective.Float32}
	var tensorBytes int64
	for i, n := range sizes {
		tensorBytes += int64(n * dts[i].Size())
	}
	for _, tc := range []struct {
		name    string
		synced  []bool
		drifted int   // a synced member whose state differs (-1: none)
		held    []int // the tensors that the ranks lacking the state hold already
		striped bool
	}{
		{"one joiner, five holders", []bool{true, true, true, true, true, false}, -1, nil, true},
		{"two joiners, four holders", []bool{true, true, false, true, false, true}, -1, nil, true},
		{"a joiner and a drifted member", []bool{true, true, true, true, false}, 2, nil, true},
		{"more joiners than holders", []bool{true, true, false, false, false}, -1, nil, false},
		{"one holder", []bool{true, false, false}, -1, nil, false},
		{"a joiner holding two tensors, five holders", []bool{true, true, true, true, true, false}, -1, []int{1, 3}, true},
		{"joiners holding two tensors, one holder", []bool{true, false, false}, -1, []int{0, 3}, false},
		{"a joiner holding every tensor", []bool{true, true, true, false}, -1, []int{0, 1, 2, 3}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := len(tc.synced)
			sent := make([][]atomic.Int64, p)
			for r := range sent {
				sent[r] = make([]atomic.Int64, p)
			}
			trs := make([]transport.Transport, p)
			addrs := make([]string, p)
			for r := range trs {
				tr := listenTCP(t)
				trs[r], addrs[r] = tr, tr.Addr()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			ranks := make([]*stripeRank, p)
			for r := range ranks {
				seed := uint64(1)
				if !tc.synced[r] || r == tc.drifted {
					seed = uint64(100 + r)
				}
				ranks[r] = newStripeRank(tc.synced[r], seed, sizes, dts, 42)
			}
			want := newStripeRank(true, 1, sizes, dts, 42)
			moved := tensorBytes
			for _, i := range tc.held {
				moved -= int64(len(want.tensors[i]))
				for r, x := range ranks {
					if !tc.synced[r] || r == tc.drifted {
						copy(x.tensors[i], want.tensors[i])
					}
				}
			}
			errs := make([]error, p)
			var wg stdsync.WaitGroup
			for r := range ranks {
				wg.Go(func() {
					w := transport.World{JobID: "stripes", Epoch: 3, Rank: r, Addrs: addrs}
					links, err := trs[r].Connect(ctx, w)
					if err != nil {
						errs[r] = err
						return
					}
					for q, l := range links {
						if l != nil {
							links[q] = countingLink{Link: l, sent: &sent[r][q]}
						}
					}
					comm, err := collective.NewFromLinks(w, links, collective.Config{ChunkBytes: 16 << 10})
					if err != nil {
						errs[r] = err
						return
					}
					defer comm.Close()
					s := &Session{synced: tc.synced[r], state: ranks[r].st, log: slog.New(slog.DiscardHandler)}
					errs[r] = enterState(ctx, s, comm)
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			for r, x := range ranks {
				if x.st.Step != 42 {
					t.Errorf("rank %d: step %d, want 42", r, x.st.Step)
				}
				if !bytes.Equal(x.blob, want.blob) {
					t.Errorf("rank %d: blob %q, want %q", r, x.blob, want.blob)
				}
				for i := range x.tensors {
					if !bytes.Equal(x.tensors[i], want.tensors[i]) {
						t.Errorf("rank %d: tensor %d differs from the job's", r, i)
					}
				}
			}
			// Besides the tensors, a rank receives the agreements' digests,
			// the step, the description and the blob: a few hundred bytes.
			const besides = 4 << 10
			for r := range p {
				lacking := !tc.synced[r] || r == tc.drifted
				var got int64
				feeders := 0
				for q := range p {
					n := sent[q][r].Load()
					got += n
					if moved > 0 && n >= moved/8 {
						feeders++
					}
				}
				switch {
				case got > moved+besides:
					t.Errorf("rank %d received %d bytes, more than the %d of the tensors that differ", r, got, moved)
				case tc.striped && lacking && moved > 0 && feeders < 2:
					t.Errorf("rank %d lacked the state and was fed by %d holders, want several", r, feeders)
				case tc.striped && !lacking && got > besides:
					t.Errorf("holder %d received %d bytes, want only the step, description and blobs", r, got)
				case !tc.striped && r != 0 && got < moved:
					t.Errorf("rank %d received %d bytes over a broadcast of %d", r, got, moved)
				}
			}
		})
	}
}

// TestJoinerWithOtherRegistrationsFedByHolders: a joiner whose
// registrations differ from the job's still gets ErrStateMismatch naming
// the difference when its state would come in stripes.
func TestJoinerWithOtherRegistrationsFedByHolders(t *testing.T) {
	const p = 4
	addrs := make([]string, p)
	trs := make([]transport.Transport, p)
	for r := range trs {
		tr := listenTCP(t)
		trs[r], addrs[r] = tr, tr.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, p)
	var wg stdsync.WaitGroup
	for r := range p {
		wg.Go(func() {
			w := transport.World{JobID: "stripes", Epoch: 1, Rank: r, Addrs: addrs}
			comm, err := collective.New(ctx, trs[r], w, collective.Config{})
			if err != nil {
				errs[r] = err
				return
			}
			defer comm.Close()
			n := 1000
			if r == p-1 {
				n = 999 // the joiner registers a tensor one element short
			}
			x := newStripeRank(r < p-1, 1, []int{n}, []collective.DType{collective.Float32}, 5)
			s := &Session{synced: r < p-1, state: x.st, log: slog.New(slog.DiscardHandler)}
			errs[r] = enterState(ctx, s, comm)
		})
	}
	wg.Wait()
	if !errors.Is(errs[p-1], ErrStateMismatch) {
		t.Fatalf("joiner: want ErrStateMismatch, got %v", errs[p-1])
	}
}
