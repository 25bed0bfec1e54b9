package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// subsetsOf builds, on every rank of comms, the subsets (id i+1: sets[i])
// that rank is a member of; subs[r][i] is nil where rank r is not.
func subsetsOf(t *testing.T, comms []*Communicator, sets [][]int) [][]*Communicator {
	t.Helper()
	subs := make([][]*Communicator, len(comms))
	for r, c := range comms {
		subs[r] = make([]*Communicator, len(sets))
		for i, members := range sets {
			if !slices.Contains(members, r) {
				continue
			}
			s, err := c.Subset(i+1, members)
			if err != nil {
				t.Fatalf("rank %d, subset %v: %v", r, members, err)
			}
			t.Cleanup(func() { s.Close() })
			subs[r][i] = s
		}
	}
	return subs
}

// subsetWork runs every kind of collective on s, a subset whose members are
// the parent's ranks members, and checks the results; n elements per rank
// (large enough to take the pipelined ring when n is).
func subsetWork(ctx context.Context, s *Communicator, members []int, n int) error {
	me, size := s.Rank(), s.Size()
	global := members[me]
	// Allreduce: every member contributes its parent rank + i.
	buf := make([]float32, n)
	for i := range buf {
		buf[i] = float32(global + i%5)
	}
	if err := Allreduce(ctx, s, buf, buf, Sum); err != nil {
		return fmt.Errorf("allreduce: %w", err)
	}
	sumRanks := 0
	for _, r := range members {
		sumRanks += r
	}
	for i, v := range buf {
		if want := float32(sumRanks + size*(i%5)); v != want {
			return fmt.Errorf("allreduce: element %d is %v, want %v", i, v, want)
		}
	}
	// Broadcast from the subset's last rank.
	b := []int64{int64(global), int64(global * 10)}
	if err := Broadcast(ctx, s, b, size-1); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	if last := int64(members[size-1]); b[0] != last || b[1] != 10*last {
		return fmt.Errorf("broadcast: got %v from subset rank %d (parent rank %d)", b, size-1, last)
	}
	// Allgather: the parent ranks, in subset order.
	all := make([]int32, size)
	if err := Allgather(ctx, s, []int32{int32(global)}, all); err != nil {
		return fmt.Errorf("allgather: %w", err)
	}
	for r, v := range all {
		if int(v) != members[r] {
			return fmt.Errorf("allgather: %v, want the members %v", all, members)
		}
	}
	// Alltoall: element r goes to subset rank r and says who sent it.
	send, recv := make([]int32, size), make([]int32, size)
	for r := range send {
		send[r] = int32(100*global + members[r])
	}
	if err := Alltoall(ctx, s, send, recv); err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	for r, v := range recv {
		if want := int32(100*members[r] + global); v != want {
			return fmt.Errorf("alltoall: from subset rank %d got %d, want %d", r, v, want)
		}
	}
	// Reduce-scatter: each member keeps one element of the sum.
	rs := make([]float64, size)
	for i := range rs {
		rs[i] = float64(global * (i + 1))
	}
	out := make([]float64, 1)
	if err := ReduceScatter(ctx, s, rs, out, Sum); err != nil {
		return fmt.Errorf("reducescatter: %w", err)
	}
	if want := float64(sumRanks * (me + 1)); out[0] != want {
		return fmt.Errorf("reducescatter: got %v, want %v", out[0], want)
	}
	if err := s.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	return nil
}

// TestSubsetCollectives runs collectives on subsets of a 4-rank world over
// real sockets: two disjoint subsets at the same time, one with a rank
// idle, one inside another; then the whole world on the parent, whose
// links the subsets used.
func TestSubsetCollectives(t *testing.T) {
	for _, tc := range []struct {
		name string
		sets [][]int
		n    int
	}{
		{"even and odd at once", [][]int{{0, 2}, {1, 3}}, 33},
		{"three while rank 0 idles", [][]int{{1, 2, 3}}, 33},
		{"large, on the pipelined ring", [][]int{{0, 1, 3}, {2}}, 300_000},
		{"overlapping subsets, in one order", [][]int{{0, 1}, {0, 1, 2, 3}, {1, 2, 3}}, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, tcpMesh, 4, Config{})
			subs := subsetsOf(t, comms, tc.sets)
			errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
				// Each rank runs its subsets in the order of tc.sets, then
				// the parent: overlapping subsets pair up in that order.
				for i, s := range subs[c.Rank()] {
					if s == nil {
						continue
					}
					if got := s.Members(); !slices.Equal(got, tc.sets[i]) {
						return fmt.Errorf("subset %d: members %v, want %v", i+1, got, tc.sets[i])
					}
					if err := subsetWork(ctx, s, tc.sets[i], tc.n); err != nil {
						return fmt.Errorf("subset %v: %w", tc.sets[i], err)
					}
				}
				v := []int32{int32(c.Rank())}
				if err := Allreduce(ctx, c, v, v, Sum); err != nil {
					return fmt.Errorf("the parent after the subsets: %w", err)
				}
				if v[0] != 6 {
					return fmt.Errorf("the parent after the subsets: sum of ranks %d, want 6", v[0])
				}
				return nil
			})
			noErrors(t, errs)
		})
	}
}

// TestSubsetsDoNotPairWithEachOther: two subsets of the same ranks, where
// each rank runs the same allreduce on a different one. Without their own
// sequence numbers the frames would pair up and the sums come out as if
// nothing were wrong; they must fail with a MismatchError naming the
// parent's rank instead, and take the parent down with them (the links'
// streams are out of step).
func TestSubsetsDoNotPairWithEachOther(t *testing.T) {
	comms := newWorld(t, tcpMesh, 4, Config{})
	members := []int{1, 3}
	subs := subsetsOf(t, comms, [][]int{members, members})
	errs := onAll(t, comms, 30*time.Second, func(ctx context.Context, c *Communicator) error {
		if c.Rank() != 1 && c.Rank() != 3 {
			return nil
		}
		s := subs[c.Rank()][0]
		if c.Rank() == 3 {
			s = subs[c.Rank()][1]
		}
		v := []float32{1, 2, 3}
		return Allreduce(ctx, s, v, v, Sum)
	})
	for _, r := range members {
		var m *MismatchError
		if !errors.As(errs[r], &m) {
			t.Fatalf("rank %d: %v, want a MismatchError", r, errs[r])
		}
		if other := 4 - r; m.Peer != other {
			t.Errorf("rank %d: the mismatch names rank %d, want the parent's rank %d: %v", r, m.Peer, other, m)
		}
		if comms[r].Err() == nil {
			t.Errorf("rank %d: the parent still works after its subset's links went out of step", r)
		}
	}
	if comms[0].Err() != nil || comms[2].Err() != nil {
		t.Errorf("ranks outside the subsets failed: %v, %v", comms[0].Err(), comms[2].Err())
	}
}

// TestSubsetStopsWithItsParent: a peer that closes its parent fails the
// subset's collective on the others with an error naming the parent's rank,
// and a closed subset leaves its parent working.
func TestSubsetStopsWithItsParent(t *testing.T) {
	comms := newWorld(t, tcpMesh, 4, Config{})
	subs := subsetsOf(t, comms, [][]int{{0, 2, 3}, {1, 2}})
	// Closing a subset leaves the parent working.
	for _, r := range []int{1, 2} {
		subs[r][1].Close()
	}
	noErrors(t, onAll(t, comms, 20*time.Second, func(ctx context.Context, c *Communicator) error {
		v := []int64{1}
		if err := Allreduce(ctx, c, v, v, Sum); err != nil {
			return err
		}
		if v[0] != 4 {
			return fmt.Errorf("sum %d, want 4", v[0])
		}
		return nil
	}))
	if err := subs[2][1].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a closed subset's barrier: %v, want ErrClosed", err)
	}
	// Rank 3 closes its parent: the subset's allreduce fails on 0 and 2,
	// and on 2 it names the parent's rank 3.
	comms[3].Close()
	errs := onAll(t, comms[:3], 20*time.Second, func(ctx context.Context, c *Communicator) error {
		s := subs[c.Rank()][0]
		if s == nil {
			return nil
		}
		v := make([]float32, 10)
		return Allreduce(ctx, s, v, v, Sum)
	})
	for _, r := range []int{0, 2} {
		if errs[r] == nil {
			t.Fatalf("rank %d: the subset's allreduce succeeded without rank 3", r)
		}
		if comms[r].Err() == nil {
			t.Errorf("rank %d: the parent works on after its subset failed", r)
		}
	}
	var pe *PeerError
	var ra *RemoteAbortError
	switch {
	case errors.As(errs[2], &pe):
		if pe.Rank != 3 && pe.Rank != 0 {
			t.Errorf("rank 2's error names rank %d: %v", pe.Rank, errs[2])
		}
	case errors.As(errs[2], &ra):
		if ra.Rank != 0 && ra.Rank != 3 {
			t.Errorf("rank 2's error names rank %d: %v", ra.Rank, errs[2])
		}
	default:
		t.Errorf("rank 2: %v, want a PeerError or RemoteAbortError", errs[2])
	}
}

func TestSubsetRefusesBadMembers(t *testing.T) {
	comms := newWorld(t, inprocMesh, 4, Config{})
	c := comms[1]
	for _, tc := range []struct {
		id      int
		members []int
	}{
		{0, []int{0, 1}},
		{MaxSubsetID + 1, []int{0, 1}},
		{1, nil},
		{1, []int{1, 0}},
		{1, []int{1, 1}},
		{1, []int{0, 2}},
		{1, []int{1, 4}},
		{1, []int{-1, 1}},
	} {
		if s, err := c.Subset(tc.id, tc.members); err == nil {
			s.Close()
			t.Errorf("Subset(%d, %v) was accepted", tc.id, tc.members)
		}
	}
}
