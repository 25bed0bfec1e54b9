package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/membership"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// These tests run a real job in one process: a driver, and engines that find
// it through gossip and connect over loopback TCP, each its own worker.

const (
	testJob    = "engine-test"
	testSecret = "engine-test-secret"
)

func startDriver(t *testing.T, min int) *driver.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := driver.Start(ctx, driver.Config{JobID: testJob, Secret: []byte(testSecret), MinWorkers: min, Membership: membership.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func startEngine(ctx context.Context, d *driver.Driver, configure ...func(*Config)) (*Engine, error) {
	cfg := DefaultConfig()
	cfg.Worker.JobID, cfg.Worker.Secret, cfg.Worker.Seeds = testJob, []byte(testSecret), []string{d.GossipAddr()}
	cfg.Worker.Transport.IOTimeout = 5 * time.Second
	for _, c := range configure {
		c(&cfg)
	}
	return Start(ctx, cfg)
}

// startEngines starts n engines together and waits until all share one
// world; configure, when given, adjusts each one's Config.
func startEngines(t *testing.T, d *driver.Driver, n int, configure ...func(*Config)) []*Engine {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	es := make([]*Engine, n)
	errs := make([]error, n)
	var wg stdsync.WaitGroup
	for i := range es {
		wg.Go(func() {
			if es[i], errs[i] = startEngine(ctx, d, configure...); errs[i] == nil {
				errs[i] = commitUntilSize(ctx, es[i], n)
			}
		})
	}
	wg.Wait()
	for _, e := range es {
		if e != nil {
			t.Cleanup(func() { e.Close(context.Background(), false) })
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("engine %d: %v", i, err)
		}
	}
	return sortByRank(es)
}

// commitUntilSize commits on e until its world has n members. Members
// admitted in different worlds meet at a commit, and a joiner is admitted
// only at a commit of the world's members: so each engine commits as soon as
// it has started, while the others may still be waiting to be admitted.
func commitUntilSize(ctx context.Context, e *Engine, n int) error {
	for e.Topology().Size < n {
		if ctx.Err() != nil {
			return fmt.Errorf("still %d of %d workers: %w", e.Topology().Size, n, ctx.Err())
		}
		err := waitOn(e)(e.Commit())
		if err != nil && !errors.Is(err, ErrHostsUpdated) && !errors.Is(err, gsync.ErrWorldChanged) {
			return err
		}
		e.Reset()
	}
	return nil
}

func sortByRank(es []*Engine) []*Engine {
	out := make([]*Engine, len(es))
	for _, e := range es {
		out[e.Topology().Rank] = e
	}
	return out
}

// each runs f on every engine at once, as the ranks of one job would.
//
// Once one f fails, each closes every engine (aborting): the others may be
// inside a collective with the rank that gave up, where they would wait out
// the I/O timeout and then the recovery timeout (minutes) for a world that
// rank never enters. The test fails with every engine's error, so the first
// one (often the cause of the others) is not hidden behind a lower rank's.
func each(t *testing.T, es []*Engine, f func(e *Engine) error) {
	t.Helper()
	errs := make([]error, len(es))
	failed := make(chan struct{})
	var failOnce stdsync.Once
	var wg stdsync.WaitGroup
	for i, e := range es {
		wg.Go(func() {
			if errs[i] = f(e); errs[i] != nil {
				failOnce.Do(func() { close(failed) })
			}
		})
	}
	all := make(chan struct{})
	go func() {
		wg.Wait()
		close(all)
	}()
	select {
	case <-all:
	case <-failed:
		var closing stdsync.WaitGroup
		for _, e := range es {
			closing.Go(func() { e.Close(context.Background(), false) })
		}
		closing.Wait()
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			t.Fatalf("the engines were closed after a failure, and some call still runs 30 s on: %v", errors.Join(errs...))
		}
	}
	var failures []string
	for i, err := range errs {
		if err != nil {
			failures = append(failures, fmt.Sprintf("engine %d: %v", i, err))
		}
	}
	if len(failures) > 0 {
		t.Fatal(strings.Join(failures, "\n"))
	}
}

// wait collects a handle (or the submission's error) with a deadline.
func waitOn(e *Engine) func(Handle, error) error {
	return func(h Handle, err error) error {
		if err != nil || h == 0 {
			return err // a Now form that ran on the caller returns 0 and its result
		}
		return e.Wait(h, 30*time.Second)
	}
}

func f32(v []float32) collective.Buffer { return collective.SliceBuffer(v) }

func TestCollectives(t *testing.T) {
	d := startDriver(t, 3)
	es := startEngines(t, d, 3)
	each(t, es, func(e *Engine) error {
		w := waitOn(e)
		top := e.Topology()
		r := float32(top.Rank)
		if top.Size != 3 || top.LocalSize != 3 || top.LocalRank != top.Rank || top.CrossSize != 1 || top.CrossRank != 0 {
			return fmt.Errorf("topology %+v on one host", top)
		}
		// A grouped allreduce of several dtypes, started asynchronously and
		// collected in reverse order, then sum with pre- and postscale.
		a, b := []float32{r, 1, 2}, []float64{float64(r) * 2}
		c := []int32{int32(r) + 1}
		ha, err := e.Allreduce(nil, []collective.Buffer{f32(a), collective.SliceBuffer(b)}, gsync.Reduction{})
		if err != nil {
			return err
		}
		hc, err := e.Allreduce(nil, []collective.Buffer{collective.SliceBuffer(c)}, gsync.Reduction{Op: collective.Product})
		if err != nil {
			return err
		}
		if err := e.Wait(hc, 30*time.Second); err != nil {
			return err
		}
		if err := e.Wait(ha, 30*time.Second); err != nil {
			return err
		}
		if a[0] != 1 || a[2] != 2 || b[0] != 2 || c[0] != 6 {
			return fmt.Errorf("averages %v %v, product %v", a, b, c)
		}
		out := make([]float32, 3)
		if err := w(e.Allreduce([]collective.Buffer{f32([]float32{r, 1, 0})}, []collective.Buffer{f32(out)},
			gsync.Reduction{Op: collective.Sum, Prescale: 2, Postscale: 0.5})); err != nil {
			return err
		}
		if out[0] != 3 || out[1] != 3 {
			return fmt.Errorf("sum with scales: %v", out)
		}
		// Broadcast from rank 2, two tensors.
		x, y := []float32{r}, []int64{int64(r) * 10}
		if err := w(e.Broadcast([]collective.Buffer{f32(x), collective.SliceBuffer(y)}, 2)); err != nil {
			return err
		}
		if x[0] != 2 || y[0] != 20 {
			return fmt.Errorf("broadcast: %v %v", x, y)
		}
		// Allgather with a different count per rank (rank r sends r+1).
		send := make([]float32, top.Rank+1)
		for i := range send {
			send[i] = r
		}
		all := make([]float32, 6)
		if err := w(e.Allgather(f32(send), f32(all), []int{1, 2, 3})); err != nil {
			return err
		}
		if fmt.Sprint(all) != "[0 1 1 2 2 2]" {
			return fmt.Errorf("allgather: %v", all)
		}
		// Alltoall: rank r sends j+1 copies of r*10+j to rank j.
		var sendA []float32
		sendCounts := []int{1, 2, 3}
		for j, n := range sendCounts {
			for range n {
				sendA = append(sendA, r*10+float32(j))
			}
		}
		n := top.Rank + 1
		recvA := make([]float32, 3*n)
		if err := w(e.Alltoall(f32(sendA), sendCounts, f32(recvA), []int{n, n, n})); err != nil {
			return err
		}
		for j := range 3 {
			for k := range n {
				if recvA[j*n+k] != float32(j*10+top.Rank) {
					return fmt.Errorf("alltoall received %v", recvA)
				}
			}
		}
		// Reduce-scatter of 6 elements, 1, 2 and 3 per rank, averaged.
		rs := []float32{r, r, r, r, r, r}
		mine := make([]float32, top.Rank+1)
		if err := w(e.ReduceScatter(f32(rs), f32(mine), []int{1, 2, 3}, gsync.Reduction{Op: collective.Average})); err != nil {
			return err
		}
		for _, v := range mine {
			if v != 1 {
				return fmt.Errorf("reducescatter: %v", mine)
			}
		}
		if err := w(e.Barrier()); err != nil {
			return err
		}
		// Adasum needs a power-of-two world: refused on every rank, and
		// the next call runs.
		if err := w(e.Allreduce(nil, []collective.Buffer{f32([]float32{1})}, gsync.Reduction{Op: collective.Adasum})); !errors.Is(err, ErrInvalid) || !errors.Is(err, collective.ErrNotPowerOfTwo) {
			return fmt.Errorf("adasum in a world of 3: %v, want ErrInvalid and ErrNotPowerOfTwo", err)
		}
		// Join: rank 1 arrives last.
		if top.Rank == 1 {
			time.Sleep(50 * time.Millisecond) // the order of arrival is the point
		}
		var last int32 = -1
		if err := w(e.Join(&last)); err != nil {
			return err
		}
		if last != 1 {
			return fmt.Errorf("join: last rank %d, want 1", last)
		}
		if p := e.Pending(); p != 0 {
			return fmt.Errorf("%d handles left", p)
		}
		return nil
	})
}

func TestInvalidArgumentsAreRefusedBeforeAnythingRuns(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	each(t, es, func(e *Engine) error {
		bad := []struct {
			name string
			call func() (Handle, error)
		}{
			{"op", func() (Handle, error) {
				return e.Allreduce(nil, []collective.Buffer{f32(make([]float32, 2))}, gsync.Reduction{Op: 9})
			}},
			{"dtype", func() (Handle, error) {
				return e.Allreduce(nil, []collective.Buffer{{DType: 42, Count: 1, Host: make([]byte, 4)}}, gsync.Reduction{Op: collective.Sum})
			}},
			{"bytes", func() (Handle, error) {
				return e.Broadcast([]collective.Buffer{{DType: collective.Float32, Count: 3, Host: make([]byte, 4)}}, 0)
			}},
			{"root", func() (Handle, error) { return e.Broadcast([]collective.Buffer{f32(make([]float32, 2))}, 2) }},
			{"counts", func() (Handle, error) { return e.Allgather(f32(make([]float32, 1)), f32(make([]float32, 2)), []int{1}) }},
			{"scale", func() (Handle, error) {
				return e.Allreduce(nil, []collective.Buffer{f32(make([]float32, 2))}, gsync.Reduction{Op: collective.Sum, Prescale: math.Inf(1)})
			}},
			{"join", func() (Handle, error) { return e.Join(nil) }},
			{"shape of another count", func() (Handle, error) {
				return e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(make([]float32, 6))}, [][]int64{{2, 2}}, gsync.Reduction{Op: collective.Sum})
			}},
			{"negative dimension", func() (Handle, error) {
				return e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(make([]float32, 0))}, [][]int64{{-1, 0}}, gsync.Reduction{Op: collective.Sum})
			}},
			{"shape that overflows", func() (Handle, error) {
				return e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(make([]float32, 0))}, [][]int64{{1 << 32, 1 << 32, 0}}, gsync.Reduction{Op: collective.Sum})
			}},
			{"shapes of other tensors", func() (Handle, error) {
				return e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(make([]float32, 1))}, [][]int64{{1}, {1}}, gsync.Reduction{Op: collective.Sum})
			}},
			{"adasum of integers", func() (Handle, error) {
				return e.Allreduce(nil, []collective.Buffer{collective.SliceBuffer([]int32{1})}, gsync.Reduction{Op: collective.Adasum})
			}},
			{"adasum reducescatter", func() (Handle, error) {
				return e.ReduceScatter(f32(make([]float32, 2)), f32(make([]float32, 1)), []int{1, 1}, gsync.Reduction{Op: collective.Adasum})
			}},
		}
		for _, b := range bad {
			if h, err := b.call(); !errors.Is(err, ErrInvalid) || h != 0 {
				return fmt.Errorf("%s: handle %d, %v; want ErrInvalid", b.name, h, err)
			}
		}
		if err := e.Wait(12345, 0); !errors.Is(err, ErrUnknownHandle) {
			return fmt.Errorf("wait on an unknown handle: %v", err)
		}
		// The world is untouched.
		v := []float32{1}
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum})); err != nil || v[0] != 2 {
			return fmt.Errorf("allreduce after the refusals: %v %v", v, err)
		}
		// A tensor without a shape is one dimension of its count: it meets
		// a shaped tensor of that one dimension on the other rank.
		var shapes [][]int64
		if e.Topology().Rank == 1 {
			shapes = [][]int64{{1}}
		}
		if err := waitOn(e)(e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(v)}, shapes, gsync.Reduction{Op: collective.Sum})); err != nil || v[0] != 4 {
			return fmt.Errorf("allreduce of a shaped and an unshaped tensor of one dimension: %v %v", v, err)
		}
		// Adasum of two tensors in one call: orthogonal ones add up,
		// identical ones stay as they are (each tensor has its own
		// coefficients although the call fuses them).
		rank := e.Topology().Rank
		orth, same := []float32{0, 0}, []float64{3, -4}
		orth[rank] = float32(rank + 1)
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(orth), collective.SliceBuffer(same)}, gsync.Reduction{Op: collective.Adasum})); err != nil {
			return err
		}
		if orth[0] != 1 || orth[1] != 2 || same[0] != 3 || same[1] != -4 {
			return fmt.Errorf("adasum: orthogonal %v (want [1 2]), identical %v (want [3 -4])", orth, same)
		}
		return nil
	})
}

// Ranks that submit different tensors get an error naming the difference,
// never a hang.
func TestMismatchedTensors(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	each(t, es, func(e *Engine) error {
		n := 10 + 10*e.Topology().Rank
		err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(make([]float32, n))}, gsync.Reduction{Op: collective.Sum}))
		var mismatch *collective.MismatchError
		if !errors.As(err, &mismatch) && !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("mismatched allreduce: %v", err)
		}
		if !strings.Contains(err.Error(), "element count") {
			return fmt.Errorf("the error does not say what differs: %v", err)
		}
		return nil
	})
}

// Ranks that call different collectives get a MismatchError naming what
// differs, every one of them, before any data moved: the world stays as it
// was and the next collective runs (as Horovod reports a mismatched request
// and goes on).
func TestMismatchedCallsFailEveryRankAndTheNextRuns(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	sum := gsync.Reduction{Op: collective.Sum}
	allreduce := func(e *Engine, n int, how gsync.Reduction) (Handle, error) {
		return e.Allreduce(nil, []collective.Buffer{f32(make([]float32, n))}, how)
	}
	for _, tc := range []struct {
		name, field string
		call        func(e *Engine, rank int) (Handle, error)
	}{
		{"element count", "element count", func(e *Engine, rank int) (Handle, error) { return allreduce(e, 10+rank, sum) }},
		{"dtype", "dtype", func(e *Engine, rank int) (Handle, error) {
			if rank == 0 {
				return allreduce(e, 4, sum)
			}
			return e.Allreduce(nil, []collective.Buffer{collective.SliceBuffer(make([]int32, 4))}, sum)
		}},
		{"reduce op", "reduce op", func(e *Engine, rank int) (Handle, error) {
			return allreduce(e, 4, gsync.Reduction{Op: []collective.ReduceOp{collective.Sum, collective.Max}[rank]})
		}},
		{"prescale", "prescale factor", func(e *Engine, rank int) (Handle, error) {
			return allreduce(e, 4, gsync.Reduction{Op: collective.Sum, Prescale: float64(rank + 1)})
		}},
		// Each rank its own root: the broadcast's frames would never show it.
		{"root", "root rank", func(e *Engine, rank int) (Handle, error) {
			return e.Broadcast([]collective.Buffer{f32(make([]float32, 4))}, rank)
		}},
		{"kind", "collective", func(e *Engine, rank int) (Handle, error) {
			if rank == 0 {
				return allreduce(e, 4, sum)
			}
			return e.Barrier()
		}},
		// As many elements in other shapes: 17×1311 and 17×23×57.
		{"shape", "tensor shapes", func(e *Engine, rank int) (Handle, error) {
			shape := [][]int64{{17, 23 * 57}, {17, 23, 57}}[rank]
			return e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(make([]float32, 17*23*57))}, [][]int64{shape}, sum)
		}},
		{"shape of the second tensor", "tensor shapes", func(e *Engine, rank int) (Handle, error) {
			shape := [][]int64{{2, 3}, {3, 2}}[rank]
			bufs := []collective.Buffer{f32(make([]float32, 4)), f32(make([]float32, 6))}
			return e.AllreduceShapedNowOn(0, nil, bufs, [][]int64{{4}, shape}, sum, Caller{})
		}},
		{"allgather counts", "element count", func(e *Engine, rank int) (Handle, error) {
			counts := []int{2, 2 + rank}
			return e.Allgather(f32(make([]float32, counts[rank])), f32(make([]float32, counts[0]+counts[1])), counts)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, es, func(e *Engine) error {
				rank, world := e.Topology().Rank, e.Topology().World
				err := waitOn(e)(tc.call(e, rank))
				var mismatch *collective.MismatchError
				if !errors.As(err, &mismatch) || mismatch.Field != tc.field || mismatch.Peer != 1-rank {
					return fmt.Errorf("want a MismatchError naming rank %d's %s, got %v", 1-rank, tc.field, err)
				}
				// The next collective runs in the same world.
				v := []float32{float32(rank + 1)}
				if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, sum)); err != nil {
					return fmt.Errorf("the allreduce after the mismatch: %v", err)
				}
				if v[0] != 3 || e.Topology().World != world {
					return fmt.Errorf("after the mismatch: sum %v (want 3), world %d (was %d)", v[0], e.Topology().World, world)
				}
				return nil
			})
		})
	}
}

// A rank that joined takes part in the others' allreduces with zeros until
// every rank has joined, as Horovod's join does; their other collectives
// fail on the ranks that call them; every rank gets the same last rank.
func TestJoinServesAllreduces(t *testing.T) {
	d := startDriver(t, 3)
	es := startEngines(t, d, 3)
	for first := range 3 {
		t.Run(fmt.Sprintf("rank %d joins first", first), func(t *testing.T) {
			lasts := make([]int32, 3)
			each(t, es, func(e *Engine) error {
				rank := e.Topology().Rank
				w := waitOn(e)
				if rank != first {
					// Two dtypes in one call, and an average: the joined
					// rank counts in the divisor with its zeros.
					a := []float32{float32(rank), 10}
					b := []int64{int64(rank) + 1}
					if err := w(e.Allreduce(nil, []collective.Buffer{f32(a), collective.SliceBuffer(b)}, gsync.Reduction{Op: collective.Sum})); err != nil {
						return err
					}
					if want := float32(3 - first); a[0] != want || a[1] != 20 || b[0] != int64(6-(first+1)) {
						return fmt.Errorf("sum with rank %d joined: %v %v", first, a, b)
					}
					v := []float64{3}
					if err := w(e.Allreduce(nil, []collective.Buffer{collective.SliceBuffer(v)}, gsync.Reduction{Op: collective.Average})); err != nil {
						return err
					}
					if v[0] != 2 {
						return fmt.Errorf("average with rank %d joined: %v, want 2", first, v[0])
					}
					var mismatch *collective.MismatchError
					if err := w(e.Broadcast([]collective.Buffer{f32(make([]float32, 2))}, 0)); !errors.As(err, &mismatch) {
						return fmt.Errorf("a broadcast while rank %d has joined: %v, want a MismatchError", first, err)
					}
				}
				return w(e.Join(&lasts[rank]))
			})
			for r, l := range lasts {
				if l != lasts[0] || int(l) == first {
					t.Fatalf("rank %d: last %d (rank 0: %d); rank %d joined first", r, l, lasts[0], first)
				}
			}
		})
	}
}

// closeWhenInside closes victim (not finished: its peers see it leave) once
// every survivor is inside a collective; wait on the group returned.
func closeWhenInside(t *testing.T, victim *Engine, survivors []*Engine) *stdsync.WaitGroup {
	// The survivors' communicators, read before any world change: they are
	// replaced only when the world changes.
	var comms []*collective.Communicator
	for _, e := range survivors {
		comms = append(comms, e.sess.Communicator())
	}
	inside := func() bool {
		for _, c := range comms {
			if !c.Progress().InFlight {
				return false
			}
		}
		return true
	}
	// A test that fails before the survivors are inside stops the watch:
	// it must not report to a test that has ended.
	stop := make(chan struct{})
	var wg stdsync.WaitGroup
	wg.Go(func() {
		deadline := time.Now().Add(time.Minute)
		for !inside() {
			select {
			case <-stop:
				return
			default:
			}
			if time.Now().After(deadline) {
				t.Error("the survivors did not enter the collective within a minute")
				break
			}
			time.Sleep(5 * time.Millisecond) // polling the communicators' progress
		}
		victim.Close(context.Background(), false)
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
	return &wg
}

// A member that dies inside a collective: the survivors' call fails with
// ErrWorldChanged after the world was rebuilt, the calls they had queued
// behind it fail without running, new submissions are refused until Reset,
// and after Reset they run in the new world.
func TestWorldChangeFailsTheOldWorldsCalls(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 3)
	victim := es[2]
	survivors := es[:2]
	big := func() collective.Buffer { return f32(make([]float32, 1<<20)) }
	wg := closeWhenInside(t, victim, survivors)
	each(t, survivors, func(e *Engine) error {
		h1, err := e.Allreduce(nil, []collective.Buffer{big()}, gsync.Reduction{})
		if err != nil {
			return err
		}
		h2, err := e.Allreduce(nil, []collective.Buffer{big()}, gsync.Reduction{})
		if err != nil {
			return err
		}
		err1 := e.Wait(h1, 30*time.Second)
		if !errors.Is(err1, gsync.ErrWorldChanged) {
			return fmt.Errorf("the interrupted allreduce: %v", err1)
		}
		if err := e.Wait(h2, 30*time.Second); !errors.Is(err, gsync.ErrWorldChanged) || !strings.Contains(err.Error(), "not run") {
			return fmt.Errorf("the allreduce queued behind it: %v", err)
		}
		if _, err := e.Barrier(); !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("a submission before Reset: %v", err)
		}
		if top := e.Topology(); top.Size != 2 {
			return fmt.Errorf("topology after the failure: %+v", top)
		}
		e.Reset()
		v := []float32{1}
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum})); err != nil || v[0] != 2 {
			return fmt.Errorf("after Reset: %v %v", v, err)
		}
		return nil
	})
	wg.Wait()
}

// A joiner is admitted at a commit, which tells the members the job moved
// (ErrHostsUpdated); a member that asks to leave is excluded at a commit.
func TestCommitJoinAndLeave(t *testing.T) {
	d := startDriver(t, 1)
	es := startEngines(t, d, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, e := range es {
		if newest, breaking := e.NewestWorld(); newest != e.Topology().World || breaking {
			t.Fatalf("rank %d in world %d knows of world %d (breaking %v) before any change", e.Topology().Rank,
				e.Topology().World, newest, breaking)
		}
	}
	joined := make(chan *Engine, 1)
	go func() {
		e, err := startEngine(ctx, d)
		if err != nil {
			t.Error(err)
		}
		joined <- e
	}()
	waitWorld(t, d, func(w epoch.World) bool { return len(w.Members) == 3 })
	// Before any call moves them, the members know of the world with the
	// joiner (it reaches them by gossip): NewestWorld is above the world
	// they are in, and it does not break theirs (no member is dead).
	for _, e := range es {
		if breaking, err := awaitNewerWorld(ctx, e); err != nil || breaking {
			t.Fatalf("a world with a joiner: breaking %v, %v", breaking, err)
		}
	}
	each(t, es, func(e *Engine) error {
		// The epoch reaches the members by gossip: a later commit (every
		// member commits the same number of times) moves them.
		for {
			err := waitOn(e)(e.Commit())
			if errors.Is(err, ErrHostsUpdated) {
				e.Reset()
				return nil
			}
			if err != nil {
				return fmt.Errorf("commit with a joiner waiting: %v, want ErrHostsUpdated", err)
			}
			if ctx.Err() != nil {
				return errors.New("the joiner was never admitted")
			}
		}
	})
	j := <-joined
	if j == nil {
		t.FailNow()
	}
	t.Cleanup(func() { j.Close(context.Background(), false) })
	all := sortByRank(append(es, j))
	if j.Topology().Rank != 2 || j.Topology().Size != 3 {
		t.Fatalf("joiner: %+v", j.Topology())
	}
	leaver := all[1]
	if err := leaver.RequestLeave(ctx); err != nil {
		t.Fatal(err)
	}
	waitWorld(t, d, func(w epoch.World) bool { return len(w.Members) == 2 })
	each(t, all, func(e *Engine) error {
		err := waitOn(e)(e.Commit())
		for err == nil && ctx.Err() == nil {
			err = waitOn(e)(e.Commit())
		}
		if e == leaver {
			if !errors.Is(err, gsync.ErrExcluded) {
				return fmt.Errorf("the leaver's commit: %v", err)
			}
			if _, err := e.Barrier(); !errors.Is(err, gsync.ErrExcluded) {
				return fmt.Errorf("a call after leaving: %v", err)
			}
			return e.Close(ctx, true)
		}
		if !errors.Is(err, ErrHostsUpdated) {
			return fmt.Errorf("commit as a member leaves: %v", err)
		}
		return nil
	})
}

// awaitNewerWorld waits until e has been told of a newer world than the
// one it is in (NewestWorld is a query without a wait: a binding polls
// it), and says whether that world breaks e's.
func awaitNewerWorld(ctx context.Context, e *Engine) (breaking bool, err error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		newest, breaking := e.NewestWorld()
		if newest > e.Topology().World {
			return breaking, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("rank %d still knows of no world after %d: %w", e.Topology().Rank, e.Topology().World, ctx.Err())
		case <-tick.C:
		}
	}
}

func waitWorld(t *testing.T, d *driver.Driver, ok func(epoch.World) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var after uint64
	for {
		w, err := d.Await(ctx, after)
		if err != nil {
			t.Fatalf("waiting for a world: %v", err)
		}
		if ok(w) {
			return
		}
		after = w.Number
	}
}

// Without a job, the engine trains in a world of one; Close fails what is
// queued and refuses what comes after.
func TestAloneAndClose(t *testing.T) {
	if gsync.UnderLauncher() {
		t.Skip("started by a launcher")
	}
	e, err := Start(context.Background(), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if top := e.Topology(); top.Size != 1 || top.Rank != 0 || top.LocalSize != 1 {
		t.Fatalf("alone: %+v", top)
	}
	h := []float64{3}
	if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{collective.SliceBuffer(h)}, gsync.Reduction{})); err != nil || h[0] != 3 {
		t.Fatalf("allreduce alone: %v %v", h, err)
	}
	if err := waitOn(e)(e.Commit()); err != nil {
		t.Fatal(err)
	}
	e.RecordSamples(5)
	e.SetTotalSteps(10)
	if err := waitOn(e)(e.Commit()); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Barrier(); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// nowOn runs a Now call to the end: the result of one that ran on the
// caller's goroutine (handle 0), or its handle's.
func nowOn(e *Engine) func(Handle, error) (inline bool, err error) {
	return func(h Handle, err error) (bool, error) {
		if err != nil || h == 0 {
			return h == 0, err
		}
		return false, e.Wait(h, 30*time.Second)
	}
}

// The Now forms run a small call on the caller's goroutine when nothing is
// queued or running, queue it otherwise (behind what came first, so that
// the ranks' calls still pair up in order), and queue a large one always.
func TestNowRunsSmallCallsOnTheCaller(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	sum := gsync.Reduction{Op: collective.Sum}
	each(t, es, func(e *Engine) error {
		now := nowOn(e)
		r := float32(e.Topology().Rank)
		v := []float32{r + 1, 10}
		// As a cgo callback calls: on a goroutine locked to its thread.
		runtime.LockOSThread()
		inline, err := now(e.AllreduceNow(nil, []collective.Buffer{f32(v)}, sum, Caller{LockedThread: true}))
		runtime.UnlockOSThread()
		if err != nil || !inline || v[0] != 3 || v[1] != 20 {
			return fmt.Errorf("small allreduce: inline %v, %v, %v", inline, v, err)
		}
		big := make([]float32, DefaultInlineBytes/4+1)
		big[0] = r
		if inline, err := now(e.AllreduceNow(nil, []collective.Buffer{f32(big)}, sum, Caller{})); err != nil || inline || big[0] != 1 {
			return fmt.Errorf("large allreduce: inline %v, %v, %v", inline, big[0], err)
		}
		b := []float32{r + 5}
		if inline, err := now(e.BroadcastNow([]collective.Buffer{f32(b)}, 1, Caller{})); err != nil || !inline || b[0] != 6 {
			return fmt.Errorf("broadcast: inline %v, %v, %v", inline, b, err)
		}
		if inline, err := now(e.BarrierNow(Caller{Interruptible: true})); err != nil || !inline {
			return fmt.Errorf("barrier: inline %v, %v", inline, err)
		}
		return nil
	})
	// Rank 0 queues an allreduce whose partner rank 1 has not called yet,
	// so it is still running when rank 0's next, small, call comes: that one
	// must queue behind it rather than run first.
	first, second := []float32{1}, []float32{100}
	h, err := es[0].Allreduce(nil, []collective.Buffer{f32(first)}, sum)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := es[0].AllreduceNow(nil, []collective.Buffer{f32(second)}, sum, Caller{})
	if err != nil || h2 == 0 {
		t.Fatalf("a Now call behind a running one: handle %d, %v", h2, err)
	}
	each(t, es[1:], func(e *Engine) error {
		a, b := []float32{2}, []float32{200}
		for _, v := range [][]float32{a, b} {
			if _, err := nowOn(e)(e.AllreduceNow(nil, []collective.Buffer{f32(v)}, sum, Caller{})); err != nil {
				return err
			}
		}
		if a[0] != 3 || b[0] != 300 {
			return fmt.Errorf("rank 1 got %v and %v, want 3 and 300", a, b)
		}
		return nil
	})
	if err := es[0].Wait(h, 30*time.Second); err != nil || first[0] != 3 {
		t.Fatalf("rank 0's queued allreduce: %v, %v", first, err)
	}
	if err := es[0].Wait(h2, 30*time.Second); err != nil || second[0] != 300 {
		t.Fatalf("rank 0's Now allreduce behind it: %v, %v", second, err)
	}
	if n := es[0].Pending(); n != 0 {
		t.Fatalf("%d handles left", n)
	}
}

// A queued call is over, executor included, once its handle completes: a
// Now call that its caller makes at once, while the executor has not yet
// come back for its next call, finds nothing running and runs on the
// caller's goroutine. (Queued instead, it still pairs with the other ranks'
// calls, but a caller cannot tell which way its call will go.) The hook
// holds the executor in that window, so the test does not depend on timing.
func TestNowRightAfterAQueuedCallRunsOnTheCaller(t *testing.T) {
	if gsync.UnderLauncher() {
		t.Skip("started by a launcher")
	}
	sum := gsync.Reduction{Op: collective.Sum}
	for _, tc := range []struct {
		name string
		now  func(e *Engine) (Handle, error)
	}{
		{"allreduce", func(e *Engine) (Handle, error) {
			return e.AllreduceNow(nil, []collective.Buffer{f32([]float32{1})}, sum, Caller{LockedThread: true})
		}},
		{"broadcast", func(e *Engine) (Handle, error) {
			return e.BroadcastNow([]collective.Buffer{f32([]float32{1})}, 0, Caller{})
		}},
		{"barrier", func(e *Engine) (Handle, error) { return e.BarrierNow(Caller{Interruptible: true}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Start(context.Background(), DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close(context.Background(), false) })
			release := make(chan struct{})
			var releaseOnce stdsync.Once
			releaseExecutor := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(releaseExecutor)
			e.mu.Lock()
			e.afterFinish = func() { <-release }
			e.mu.Unlock()
			queued := make([]float32, DefaultInlineBytes/4+1)
			if inline, err := nowOn(e)(e.AllreduceNow(nil, []collective.Buffer{f32(queued)}, sum, Caller{})); err != nil || inline {
				t.Fatalf("the large allreduce: inline %v, %v", inline, err)
			}
			// The executor is held after completing it.
			h, err := tc.now(e)
			releaseExecutor()
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if h != 0 {
				err := e.Wait(h, 30*time.Second)
				t.Fatalf("%s right after a queued call was queued (handle %d, %v), not run on the caller", tc.name, h, err)
			}
		})
	}
}

// Interrupt aborts an interruptible call running on its caller's goroutine
// (a peer that never calls), within a bounded time; the next collective
// finds the world rebuilt.
func TestInterruptAbortsACallOnTheCaller(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	e := es[0]
	e.Interrupt(1) // nothing running: nothing happens
	comm := e.sess.Communicator()
	done := make(chan error, 1)
	go func() {
		// The caller has seen 2 interrupts: reports of those leave it alone.
		_, err := e.AllreduceNow(nil, []collective.Buffer{f32([]float32{1})}, gsync.Reduction{}, Caller{Interruptible: true, Interrupts: 2})
		done <- err
	}()
	deadline := time.Now().Add(time.Minute)
	for !comm.Progress().InFlight {
		if time.Now().After(deadline) {
			t.Fatal("the allreduce did not start within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling the communicator's progress
	}
	e.Interrupt(2) // an interrupt from before the call
	select {
	case err := <-done:
		t.Fatalf("the allreduce returned without its peer: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	start := time.Now()
	e.Interrupt(3)
	select {
	case err := <-done:
		if !errors.Is(err, ErrInterrupted) {
			t.Fatalf("interrupted allreduce: %v", err)
		}
		t.Logf("interrupted after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("Interrupt did not end the allreduce within 10 s")
	}
	// An interrupt reported before the call was marked running, but after
	// its caller's count, stops it before it starts.
	if _, err := e.AllreduceNow(nil, []collective.Buffer{f32([]float32{1})}, gsync.Reduction{}, Caller{Interruptible: true, Interrupts: 2}); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("a call whose interrupt came first: %v", err)
	}
	// Both ranks go on in a rebuilt world once they acknowledge it.
	each(t, es, func(e *Engine) error {
		for {
			v := []float32{1}
			_, err := nowOn(e)(e.AllreduceNow(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum}, Caller{}))
			switch {
			case errors.Is(err, gsync.ErrWorldChanged):
				e.Reset()
				continue
			case err != nil:
				return err
			case v[0] != float32(e.Topology().Size):
				return fmt.Errorf("sum %v in a world of %d", v, e.Topology().Size)
			}
			return nil
		}
	})
}

// A peer that dies while a call runs on its caller's goroutine: the call
// fails with ErrWorldChanged, and so does every submission until Reset.
func TestWorldChangeDuringACallOnTheCaller(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 3)
	victim, survivors := es[2], es[:2]
	wg := closeWhenInside(t, victim, survivors)
	each(t, survivors, func(e *Engine) error {
		h, err := e.AllreduceNow(nil, []collective.Buffer{f32([]float32{1})}, gsync.Reduction{}, Caller{Interruptible: true})
		if h != 0 || !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("the broken allreduce: handle %d, %v", h, err)
		}
		if _, err := e.BarrierNow(Caller{}); !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("a call before Reset: %v", err)
		}
		e.Reset()
		v := []float32{1}
		if _, err := nowOn(e)(e.AllreduceNow(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum}, Caller{})); err != nil || v[0] != 2 {
			return fmt.Errorf("after Reset: %v %v", v, err)
		}
		return nil
	})
	wg.Wait()
}
