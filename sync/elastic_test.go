package sync

import (
	"context"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/membership"
)

// These tests run the real control plane in one process: a Driver and
// workers that find it through gossip and connect over TCP.

func startDriver(t *testing.T, min int) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := StartDriver(ctx, DriverConfig{JobID: "elastic-test", Secret: []byte("elastic-test-secret"), MinWorkers: min, Membership: membership.DefaultConfig()})
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

func joinElastic(t *testing.T, ctx context.Context, d *Driver) (*elasticToy, error) {
	params := make([]float32, 3000)
	st := NewTrainState()
	st.RegisterTensor("params", params)
	cfg := WorkerConfig{JobID: "elastic-test", Secret: []byte("elastic-test-secret"), Seeds: []string{d.GossipAddr()},
		Session: DefaultConfig(), Membership: membership.DefaultConfig(), IOTimeout: 2 * time.Second}
	cfg.Session.FusionBytes = 4096
	w, err := StartWorker(ctx, cfg, st)
	if err != nil {
		return nil, err
	}
	return &elasticToy{w: w, params: params}, nil
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
			err = toyLoop(ctx, toy.w.Session, toy.w.Name(), toy.params, until, rec, vanish, func() {
				// A crash: no graceful leave, links and gossip just stop.
				toy.w.Session.Communicator().Abort(fmt.Errorf("killed"))
				toy.w.m.Shutdown()
				toy.w.tr.Close()
			})
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
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
				waitFor(t, d, func(e Epoch) bool { return len(e.Members) == 4 })
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

func waitFor(t *testing.T, d *Driver, ok func(Epoch) bool) {
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
	run := func(name string, vanish func(int64) bool) {
		wg.Go(func() {
			toy, err := joinElastic(t, ctx, d)
			if err != nil {
				errs <- fmt.Errorf("%s: join: %w", name, err)
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
		if step == 10 {
			driverGone.Do(func() { d.Close(); close(gone) })
		}
		return false
	})
	run("w1", nil)
	run("w2", func(step int64) bool {
		crash := false
		if step == 20 {
			crashOnce.Do(func() {
				<-gone
				crash = true
			})
		}
		return crash
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := agree(t, rec); n[until] != 2 {
		t.Fatalf("step %d recorded by %d workers, want 2", until, n[until])
	}
}
