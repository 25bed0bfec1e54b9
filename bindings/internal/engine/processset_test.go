package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/epoch"
)

// addSet adds ranks as a process set on e and returns its id.
func addSet(e *Engine, ranks ...int) (int32, error) {
	var id int32
	err := waitOn(e)(e.AddProcessSet(ranks, &id))
	return id, err
}

// setWork runs every collective on set id, whose members are the world
// ranks members, and checks the results.
func setWork(e *Engine, id int32, members []int) error {
	w := waitOn(e)
	rank := e.Topology().Rank
	me := slices.Index(members, rank)
	n := len(members)
	sumRanks := 0
	for _, r := range members {
		sumRanks += r
	}
	sum := gsync.Reduction{Op: collective.Sum}
	// A grouped allreduce of two dtypes; then an average.
	a, b := []float32{float32(rank), 1}, []int64{int64(rank) * 10}
	if err := w(e.AllreduceOn(id, nil, []collective.Buffer{f32(a), collective.SliceBuffer(b)}, sum)); err != nil {
		return fmt.Errorf("allreduce: %w", err)
	}
	if a[0] != float32(sumRanks) || a[1] != float32(n) || b[0] != int64(10*sumRanks) {
		return fmt.Errorf("allreduce: %v %v, want %d %d %d", a, b, sumRanks, n, 10*sumRanks)
	}
	avg := []float64{float64(rank)}
	if err := w(e.AllreduceOn(id, nil, []collective.Buffer{collective.SliceBuffer(avg)}, gsync.Reduction{})); err != nil {
		return fmt.Errorf("average: %w", err)
	}
	if want := float64(sumRanks) / float64(n); avg[0] != want {
		return fmt.Errorf("average: %v, want %v (divided by the set's size)", avg[0], want)
	}
	// Broadcast from the last member, named by its world rank.
	root := members[n-1]
	bc := []float32{float32(rank)}
	if err := w(e.BroadcastOn(id, []collective.Buffer{f32(bc)}, root)); err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	if bc[0] != float32(root) {
		return fmt.Errorf("broadcast from world rank %d: got %v", root, bc[0])
	}
	// Allgather with a count per member.
	counts := make([]int, n)
	total := 0
	for i, r := range members {
		counts[i] = r + 1
		total += r + 1
	}
	send := make([]float32, rank+1)
	for i := range send {
		send[i] = float32(rank)
	}
	all := make([]float32, total)
	if err := w(e.AllgatherOn(id, f32(send), f32(all), counts)); err != nil {
		return fmt.Errorf("allgather: %w", err)
	}
	at := 0
	for _, r := range members {
		for range r + 1 {
			if all[at] != float32(r) {
				return fmt.Errorf("allgather: %v", all)
			}
			at++
		}
	}
	// Alltoall: one element to each member.
	ones := make([]int, n)
	for i := range ones {
		ones[i] = 1
	}
	out, in := make([]float32, n), make([]float32, n)
	for i, r := range members {
		out[i] = float32(100*rank + r)
	}
	if err := w(e.AlltoallOn(id, f32(out), ones, f32(in), ones)); err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	for i, r := range members {
		if in[i] != float32(100*r+rank) {
			return fmt.Errorf("alltoall: %v", in)
		}
	}
	// Reduce-scatter: one element each.
	rs := make([]float32, n)
	for i := range rs {
		rs[i] = float32(rank * (i + 1))
	}
	mine := make([]float32, 1)
	if err := w(e.ReduceScatterOn(id, f32(rs), f32(mine), ones, sum)); err != nil {
		return fmt.Errorf("reducescatter: %w", err)
	}
	if mine[0] != float32(sumRanks*(me+1)) {
		return fmt.Errorf("reducescatter: %v, want %d", mine[0], sumRanks*(me+1))
	}
	if err := w(e.BarrierOn(id)); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	return nil
}

// TestProcessSets: in a world of four, the even and the odd ranks run every
// collective on their own process set at the same time, then the world runs
// one; the sets' ids and members are the same on every rank; calls that
// cannot run are refused with the errors a binding turns into Horovod's.
func TestProcessSets(t *testing.T) {
	d := startDriver(t, 4)
	es := startEngines(t, d, 4)
	ids := make([][2]int32, 4)
	each(t, es, func(e *Engine) error {
		rank := e.Topology().Rank
		even, err := addSet(e, 2, 0) // any order
		if err != nil {
			return fmt.Errorf("adding the even set: %w", err)
		}
		odd, err := addSet(e, 1, 3)
		if err != nil {
			return fmt.Errorf("adding the odd set: %w", err)
		}
		ids[rank] = [2]int32{even, odd}
		info, err := e.ProcessSet(even)
		if err != nil {
			return err
		}
		wantRank := -1
		if rank%2 == 0 {
			wantRank = rank / 2
		}
		if !slices.Equal(info.Ranks, []int{0, 2}) || info.Rank != wantRank {
			return fmt.Errorf("the even set: %+v, want ranks [0 2] and rank %d", info, wantRank)
		}
		if got := e.ProcessSets(); !slices.Equal(got, []int32{0, even, odd}) {
			return fmt.Errorf("ProcessSets: %v", got)
		}
		mine, other, members := even, odd, []int{0, 2}
		if rank%2 == 1 {
			mine, other, members = odd, even, []int{1, 3}
		}
		if err := setWork(e, mine, members); err != nil {
			return fmt.Errorf("on set %d %v: %w", mine, members, err)
		}
		// What cannot run is refused at once, the world untouched.
		if _, err := e.BarrierOn(other); !errors.Is(err, ErrNotMember) || !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("a barrier on a set without this rank: %v", err)
		}
		if _, err := e.BroadcastOn(mine, []collective.Buffer{f32(make([]float32, 1))}, members[0]^1); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("a broadcast from a root outside the set: %v", err)
		}
		if _, err := e.AllgatherOn(mine, f32(make([]float32, 1)), f32(make([]float32, 4)), []int{1, 1, 1, 1}); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("an allgather with a count per world rank: %v", err)
		}
		if _, err := e.BarrierOn(99); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("a barrier on an unknown set: %v", err)
		}
		if _, err := e.AddProcessSet([]int{0, 4}, new(int32)); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("adding a set with a rank outside the world: %v", err)
		}
		// Duplicates, the world's own ranks included, fail on every rank.
		if _, err := addSet(e, 0, 2); !errors.Is(err, ErrDuplicateSet) {
			return fmt.Errorf("adding the even set again: %v", err)
		}
		if _, err := addSet(e, 0, 1, 2, 3); !errors.Is(err, ErrDuplicateSet) {
			return fmt.Errorf("adding the whole world: %v", err)
		}
		// Ranks that add different sets all fail, and the world goes on.
		var mismatch *collective.MismatchError
		if _, err := addSet(e, 0, 1+rank/3); !errors.As(err, &mismatch) {
			return fmt.Errorf("adding different sets: %v, want a MismatchError", err)
		}
		v := []float32{1}
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum})); err != nil || v[0] != 4 {
			return fmt.Errorf("the world after the sets: %v %v", v, err)
		}
		// Removal, then the set is unknown.
		if err := waitOn(e)(e.RemoveProcessSet(odd)); err != nil {
			return fmt.Errorf("removing the odd set: %w", err)
		}
		if _, err := e.BarrierOn(odd); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("a barrier on a removed set: %v", err)
		}
		if _, err := e.RemoveProcessSet(odd); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("removing it twice: %v", err)
		}
		if _, err := e.RemoveProcessSet(0); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("removing the world: %v", err)
		}
		// A set added after a removal gets a new id.
		again, err := addSet(e, 1, 3)
		if err != nil || again <= odd {
			return fmt.Errorf("adding the odd set again: id %d after %d, %v", again, odd, err)
		}
		return nil
	})
	for r := range ids {
		if ids[r] != ids[0] {
			t.Fatalf("the sets' ids differ between ranks: %v", ids)
		}
	}
}

// TestProcessSetsOverlapAndIdle: a set of three while rank 0 idles, then a
// set inside it, each rank in its own order of submission (asynchronous
// calls queued back to back).
func TestProcessSetsOverlapAndIdle(t *testing.T) {
	d := startDriver(t, 4)
	es := startEngines(t, d, 4)
	each(t, es, func(e *Engine) error {
		rank := e.Topology().Rank
		three, err := addSet(e, 1, 2, 3)
		if err != nil {
			return err
		}
		two, err := addSet(e, 2, 3)
		if err != nil {
			return err
		}
		if rank == 0 {
			return nil // idle: the others need nothing of it
		}
		sum := gsync.Reduction{Op: collective.Sum}
		a, b := []float32{1}, []float32{1}
		ha, err := e.AllreduceOn(three, nil, []collective.Buffer{f32(a)}, sum)
		if err != nil {
			return err
		}
		var hb Handle
		if rank >= 2 {
			if hb, err = e.AllreduceOn(two, nil, []collective.Buffer{f32(b)}, sum); err != nil {
				return err
			}
		}
		if err := e.Wait(ha, 30*time.Second); err != nil || a[0] != 3 {
			return fmt.Errorf("on the set of three: %v %v", a, err)
		}
		if hb != 0 {
			if err := e.Wait(hb, 30*time.Second); err != nil || b[0] != 2 {
				return fmt.Errorf("on the set of two: %v %v", b, err)
			}
		}
		return nil
	})
}

// TestProcessSetsAndWorldChanges: a world change removes every set but the
// world's (their ranks were the old world's); after Reset the members add
// what they need again, a worker that joined included, and every rank gets
// the same id for it although the joiner had added none before.
func TestProcessSetsAndWorldChanges(t *testing.T) {
	d := startDriver(t, 1)
	es := startEngines(t, d, 3)
	olds := make([]int32, len(es))
	each(t, es, func(e *Engine) error {
		if _, err := addSet(e, 0, 1); err != nil {
			return err
		}
		id, err := addSet(e, 1, 2)
		olds[e.Topology().Rank] = id
		return err
	})
	old := olds[0]
	for _, id := range olds {
		if id != old {
			t.Fatalf("the sets' ids differ between ranks: %v", olds)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	joined := make(chan *Engine, 1)
	go func() {
		e, err := startEngine(ctx, d)
		if err != nil {
			t.Error(err)
		}
		joined <- e
	}()
	waitWorld(t, d, func(w epoch.World) bool { return len(w.Members) == 4 })
	each(t, es, func(e *Engine) error {
		for {
			err := waitOn(e)(e.Commit())
			if errors.Is(err, ErrHostsUpdated) {
				break
			}
			if err != nil || ctx.Err() != nil {
				return fmt.Errorf("commit with a joiner waiting: %v", err)
			}
		}
		if _, err := e.ProcessSet(old); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("a set of the old world after the change: %v", err)
		}
		e.Reset()
		if _, err := e.BarrierOn(old); !errors.Is(err, ErrUnknownSet) {
			return fmt.Errorf("a barrier on a set of the old world: %v", err)
		}
		return nil
	})
	j := <-joined
	if j == nil {
		t.FailNow()
	}
	t.Cleanup(func() { j.Close(context.Background(), false) })
	all := sortByRank(append(es, j))
	ids := make([]int32, 4)
	each(t, all, func(e *Engine) error {
		rank := e.Topology().Rank
		id, err := addSet(e, 0, 3)
		if err != nil {
			return err
		}
		ids[rank] = id
		if got := e.ProcessSets(); !slices.Equal(got, []int32{0, id}) {
			return fmt.Errorf("sets after the change: %v", got)
		}
		if rank == 0 || rank == 3 {
			return setWork(e, id, []int{0, 3})
		}
		return nil
	})
	for r, id := range ids {
		if id != ids[0] || id <= old {
			t.Fatalf("ids of the set added after the change: %v (rank %d), want one id above %d", ids, r, old)
		}
	}
}

// TestAddProcessSetWaitedInSlices: a registration is a queued call whose
// handle a caller may wait on with a timeout (the C ABI's
// gorovod_add_process_set_async, which the Python binding's new_group waits
// on within its timeout): while the last rank has not made it, rank 0's
// wait times out and leaves the handle valid and the id unwritten; once the
// last rank makes it (told by rank 0 after the timeout), it completes on
// every rank with the same id, and the set works.
func TestAddProcessSetWaitedInSlices(t *testing.T) {
	d := startDriver(t, 3)
	es := startEngines(t, d, 3)
	told := make(chan struct{})
	ids := make([]int32, len(es))
	each(t, es, func(e *Engine) error {
		rank := e.Topology().Rank
		if rank == len(es)-1 {
			<-told
		}
		id := int32(-1)
		h, err := e.AddProcessSet([]int{1, 2}, &id)
		if err != nil {
			return err
		}
		if rank == 0 {
			if err := e.Wait(h, 50*time.Millisecond); !errors.Is(err, ErrNotDone) {
				return fmt.Errorf("a registration the last rank has not made: %v, want ErrNotDone", err)
			}
			if done, err := e.Poll(h); done || err != nil {
				return fmt.Errorf("after the timeout: done %v, %v", done, err)
			}
			close(told)
		}
		if err := e.Wait(h, 30*time.Second); err != nil {
			return fmt.Errorf("the registration once every rank made it: %w", err)
		}
		ids[rank] = id
		if rank != 0 {
			return setWork(e, id, []int{1, 2})
		}
		return nil
	})
	if ids[0] <= 0 || ids[1] != ids[0] || ids[2] != ids[0] {
		t.Fatalf("ids of the registration waited in slices: %v, want one id above 0", ids)
	}
}
