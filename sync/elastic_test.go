package sync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport/multi"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// These tests run the real control plane in one process: a Driver and
// workers that find it through gossip and connect over TCP.

func startDriver(t *testing.T, min int) *driver.Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := driver.Start(ctx, driver.Config{JobID: "elastic-test", Secret: []byte("elastic-test-secret"), MinWorkers: min, Membership: membership.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

type elasticToy struct {
	w      *Worker
	params []float32
}

func joinElastic(t *testing.T, ctx context.Context, d *driver.Driver, edits ...func(*WorkerConfig)) (*elasticToy, error) {
	params := make([]float32, 3000)
	st := NewState()
	st.RegisterTensor("params", params)
	cfg := WorkerConfig{JobID: "elastic-test", Secret: []byte("elastic-test-secret"), Seeds: []string{d.GossipAddr()},
		Session: DefaultConfig(), Membership: membership.DefaultConfig(), Transport: multi.Config{IOTimeout: 2 * time.Second}}
	cfg.Session.FusionBytes = 4096
	for _, edit := range edits {
		edit(&cfg)
	}
	w, err := StartWorker(ctx, cfg, st)
	if err != nil {
		return nil, err
	}
	return &elasticToy{w: w, params: params}, nil
}

// joinWhenAllIn joins a worker and returns it once allIn is closed (the
// test saw the driver propose a world of all its workers), so that every
// worker trains from the same step.
func joinWhenAllIn(t *testing.T, ctx context.Context, d *driver.Driver, name string, allIn <-chan struct{}) (*elasticToy, error) {
	toy, err := joinElastic(t, ctx, d)
	if err != nil {
		return nil, fmt.Errorf("%s: join: %w", name, err)
	}
	select {
	case <-allIn:
		return toy, nil
	case <-ctx.Done():
		toy.w.Close()
		return nil, fmt.Errorf("%s: no world of all the workers: %w", name, ctx.Err())
	}
}

func TestElasticJobOverGossip(t *testing.T) {
	d := startDriver(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rec := &recorder{}
	var wg stdsync.WaitGroup
	errs := make(chan error, 8)
	const until = 60
	run := func(name string, vanish func(int64) bool) {
		wg.Go(func() {
			toy, err := joinElastic(t, ctx, d)
			if err != nil {
				errs <- fmt.Errorf("%s: join: %w", name, err)
				return
			}
			defer toy.w.Close()
			crashed := false
			for {
				err = toyLoop(ctx, toy.w.Session, name, toy.params, until, rec, vanish, func() {
					// A crash: no graceful leave, links and gossip just stop.
					crashed = true
					toy.w.Session.Communicator().Abort(fmt.Errorf("killed"))
					toy.w.m.Shutdown()
					toy.w.tr.Close()
				})
				if crashed || err == nil && toy.w.Step() >= until {
					return
				}
				if err != nil && !errors.Is(err, ErrExcluded) {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
				// Left out of a world while unreachable: on a loaded machine
				// gossip may declare a live worker dead. It comes back as a new
				// member, as Train does.
				if err := toy.w.Rejoin(ctx); err != nil {
					errs <- fmt.Errorf("%s: rejoining: %w", name, err)
					return
				}
			}
		})
	}
	var addOnce, crashOnce stdsync.Once
	// w0 drives the scenario from inside the training loop, so each change
	// happens at a known step: at 10 a fourth worker joins, at 25 w1 crashes.
	run("w0", func(step int64) bool {
		if step == 10 {
			addOnce.Do(func() {
				run("w3", nil)
				waitFor(t, d, func(e epoch.World) bool { return len(e.Members) == 4 })
			})
		}
		return false
	})
	run("w1", func(step int64) bool {
		crash := false
		if step == 25 {
			crashOnce.Do(func() { crash = true })
		}
		return crash
	})
	run("w2", nil)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n := agree(t, rec)
	if n[until] != 3 {
		t.Fatalf("step %d recorded by %d workers, want 3", until, n[until])
	}
}

func waitFor(t *testing.T, d *driver.Driver, ok func(epoch.World) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var after uint64
	for {
		e, err := d.Await(ctx, after)
		if err != nil {
			t.Errorf("waiting for an epoch: %v", err)
			return
		}
		if ok(e) {
			return
		}
		after = e.Number
	}
}

// TestWorkerTakesOverWhenDriverDies: after the driver is gone, the oldest
// ready worker proposes; a worker that then crashes is replaced by an epoch
// without it, and the survivors train on.
func TestWorkerTakesOverWhenDriverDies(t *testing.T) {
	d := startDriver(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rec := &recorder{}
	var wg stdsync.WaitGroup
	errs := make(chan error, 8)
	const until = 40
	var driverGone, crashOnce stdsync.Once
	gone := make(chan struct{})
	// Training starts once the driver has proposed a world of all three:
	// a worker that joined after the others passed step 10 would never
	// close the driver (CI: w2 then waited for it for good).
	allIn := make(chan struct{})
	run := func(name string, vanish func(int64) bool) {
		wg.Go(func() {
			toy, err := joinWhenAllIn(t, ctx, d, name, allIn)
			if err != nil {
				errs <- err
				return
			}
			defer toy.w.Close()
			err = toyLoop(ctx, toy.w.Session, toy.w.Name(), toy.params, until, rec, vanish, func() {
				toy.w.Session.Communicator().Abort(fmt.Errorf("killed"))
				toy.w.m.Shutdown()
				toy.w.tr.Close()
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	run("w0", func(step int64) bool {
		if step >= 10 {
			driverGone.Do(func() { d.Close(); close(gone) })
		}
		return false
	})
	run("w1", nil)
	run("w2", func(step int64) bool {
		crash := false
		if step >= 20 {
			select {
			case <-gone: // crash only once the driver is gone, at the next step if need be
				crashOnce.Do(func() { crash = true })
			default:
			}
		}
		return crash
	})
	waitFor(t, d, func(e epoch.World) bool { return len(e.Members) == 3 })
	close(allIn)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := agree(t, rec); n[until] != 2 {
		t.Fatalf("step %d recorded by %d workers, want 2", until, n[until])
	}
}

// A collective of the final step can complete on some workers and fail on
// others: those that completed finish the job and leave, and the others must
// still get a world to redo the step in (here, a world of one, below the
// job's minimum of 3), not wait for one until their recovery timeout. w2 runs
// one step more than w0 and w1, as a worker whose last step failed does once
// the others are gone.
func TestUnfinishedWorkerFinishesTheLastStep(t *testing.T) {
	d := startDriver(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rec := &recorder{}
	var wg stdsync.WaitGroup
	errs := make(chan error, 3)
	run := func(until int64) {
		wg.Go(func() {
			toy, err := joinElastic(t, ctx, d, func(c *WorkerConfig) { c.Session.RecoveryTimeout = 30 * time.Second })
			if err != nil {
				errs <- err
				return
			}
			err = toyLoop(ctx, toy.w.Session, toy.w.Name(), toy.params, until, rec, nil, nil)
			if err != nil {
				toy.w.Close()
				errs <- fmt.Errorf("%s (training to step %d): %w", toy.w.Name(), until, err)
				return
			}
			if err := toy.w.Finish(ctx); err != nil {
				errs <- err
			}
		})
	}
	run(20)
	run(20)
	run(21)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := agree(t, rec); n[20] != 3 || n[21] != 1 {
		t.Fatalf("step 20 recorded by %d workers, step 21 by %d; want 3 and 1", n[20], n[21])
	}
	// The launcher lets the unfinished workers of the last world finish;
	// none is left once w2 has said it finished.
	if e := d.Current(); len(e.Members) != 1 {
		t.Errorf("the last world is %v, want w2's alone", e)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for u := d.Unfinished(); len(u) != 0; u = d.Unfinished() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("still unfinished after every worker finished: %v", u)
		}
	}
}

// Gossip's verdict alone does not stop the world: under load memberlist
// declares live workers dead (their 100 ms probes time out on starved
// cores), and a worker that stopped its collective for that verdict made
// the whole world fail and re-form. Here w0's gossip declares another
// member dead at step 10 while it trains on; the proposer keeps it (it
// answers), so every step is committed in the one world of three.
func TestGossipVerdictAloneKeepsTheWorld(t *testing.T) {
	d := startDriver(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rec := &recorder{}
	var wg stdsync.WaitGroup
	errs := make(chan error, 3)
	const until = 30
	var verdict stdsync.Once
	allIn := make(chan struct{})
	for _, name := range []string{"w0", "w1", "w2"} {
		wg.Go(func() {
			toy, err := joinWhenAllIn(t, ctx, d, name, allIn)
			if err != nil {
				errs <- err
				return
			}
			defer toy.w.Close()
			var vanish func(int64) bool
			if name == "w0" {
				vanish = func(step int64) bool {
					if step >= 10 {
						verdict.Do(func() {
							for _, m := range toy.w.Session.World().Members {
								if m.Name != toy.w.Name() {
									toy.w.src.peerFailed(m.Name)
									return
								}
							}
						})
					}
					return false
				}
			}
			if err := toyLoop(ctx, toy.w.Session, name, toy.params, until, rec, vanish, nil); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	waitFor(t, d, func(e epoch.World) bool { return len(e.Members) == 3 })
	close(allIn)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := agree(t, rec); n[until] != 3 {
		t.Fatalf("step %d recorded by %d workers, want 3", until, n[until])
	}
	worlds := map[uint64]bool{}
	rec.mu.Lock()
	for _, r := range rec.recs {
		worlds[r.epoch] = true
	}
	rec.mu.Unlock()
	if len(worlds) != 1 {
		t.Errorf("steps committed in worlds %v, want one world of three throughout", slices.Sorted(maps.Keys(worlds)))
	}
}
