package sync

import (
	"context"
	"math"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/stats"
)

// statsSink collects one worker's step statistics.
type statsSink struct {
	mu      stdsync.Mutex
	batches []stats.Batch
}

func (s *statsSink) add(b stats.Batch) {
	s.mu.Lock()
	s.batches = append(s.batches, b)
	s.mu.Unlock()
}

// Sessions time every committed step: each is reported once, in the epoch it
// ran in, with the samples the trainer recorded; a worker that computes longer
// shows it in Compute, while both see the same step time; a world change
// ends the batch (it goes out with the next world's first commit).
func TestSessionStepStatistics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	const steps, growAt = 40, 20
	const slowCompute = 8 * time.Millisecond
	names := []string{"fast", "slow", "late"}
	sinks := map[string]*statsSink{}
	workers := map[string]*toyWorker{}
	for _, n := range names[:2] {
		workers[n] = startToy(t, n, coord, 256)
		sinks[n] = &statsSink{}
	}
	errs := make(chan error, 3)
	var run func(name string) error
	run = func(name string) error {
		w := workers[name]
		sess, err := joinCoord(ctx, coord, name, w.tr, w.state, func(sc *Config) { sc.OnStats, sc.StatsEvery = sinks[name].add, 5 })
		if err != nil {
			return err
		}
		defer sess.Close()
		sess.SetTotalSteps(steps)
		grads := collective.SliceBuffer(make([]float32, 256))
		for sess.Step() < steps {
			if name == "slow" {
				time.Sleep(slowCompute) // simulated compute: the others wait for it
			}
			sess.RecordSamples(4)
			sess.RecordSamples(4)
			sess.RecordLoss(1) // averaged within the step: 1.5
			sess.RecordLoss(math.NaN())
			sess.RecordLoss(2)
			if err := sess.Allreduce(ctx, Reduction{}, grads); err != nil {
				return err
			}
			if name == "fast" && sess.Step() == growAt-1 {
				workers["late"] = startToy(t, "late", coord, 256)
				sinks["late"] = &statsSink{}
				go func() { errs <- run("late") }()
			}
			if err := sess.Commit(ctx); err != nil {
				return err
			}
		}
		if b, ok := sess.clock.Take(); ok {
			sinks[name].add(b)
		}
		return nil
	}
	go func() { errs <- run("fast") }()
	go func() { errs <- run("slow") }()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The joiner is admitted at whichever step boundary first learns of its
	// epoch: find that step from the fast worker's reports, then hold every
	// worker to it.
	lastOfFirst := int64(0)
	for _, b := range sinks["fast"].batches {
		for _, st := range b.Steps {
			if st.Epoch == 1 {
				lastOfFirst = max(lastOfFirst, st.Step)
			}
		}
	}
	if lastOfFirst < growAt-1 || lastOfFirst >= steps {
		t.Fatalf("the world changed after step %d; the joiner arrived at step %d", lastOfFirst, growAt-1)
	}
	medianCompute := map[string]time.Duration{}
	for _, name := range names {
		var got []stats.Step
		for _, b := range sinks[name].batches {
			if b.TotalSteps != steps {
				t.Errorf("%s: batch with total %d, want %d", name, b.TotalSteps, steps)
			}
			got = append(got, b.Steps...)
			// A batch holding the last step of epoch 1 ends there.
			for i, st := range b.Steps {
				if st.Step == lastOfFirst && i != len(b.Steps)-1 {
					t.Errorf("%s: the batch with the last step of epoch 1 goes on to step %d", name, b.Steps[len(b.Steps)-1].Step)
				}
			}
		}
		first := int64(1)
		if name == "late" {
			first = lastOfFirst + 1
		}
		if len(got) != int(steps-first+1) {
			t.Fatalf("%s: %d steps reported, want %d..%d", name, len(got), first, steps)
		}
		var computes []time.Duration
		for i, st := range got {
			wantEpoch := uint64(1)
			if st.Step > lastOfFirst {
				wantEpoch = 2
			}
			if st.Step != first+int64(i) || st.Epoch != wantEpoch || st.Samples != 8 || st.Compute < 0 || st.Compute > st.StepTime {
				t.Fatalf("%s: report %d is %+v (want step %d, epoch %d, 8 samples)", name, i, st, first+int64(i), wantEpoch)
			}
			// The loss the trainer recorded (NaN left out), the gradients'
			// bytes, and the move to a new world on the world's first step.
			firstInWorld := st.Step == first || st.Step == lastOfFirst+1
			if !st.HasLoss || st.Loss != 1.5 || st.Bytes != 256*4 || (st.Switch > 0) != firstInWorld {
				t.Fatalf("%s: report %d is %+v (want loss 1.5, 1024 bytes, a world switch: %v)", name, i, st, firstInWorld)
			}
			computes = append(computes, st.Compute)
		}
		slices.Sort(computes)
		medianCompute[name] = computes[len(computes)/2]
	}
	if medianCompute["slow"] < slowCompute || medianCompute["fast"] > slowCompute/2 {
		t.Errorf("median compute: slow %v, fast %v; want the slow worker's sleep in its compute only", medianCompute["slow"], medianCompute["fast"])
	}
}

// Time in Session.Collective is time blocked on the others, as in Allreduce:
// a binding that checks each call with a small collective before its
// allreduce (bindings/internal/engine's agreement) waits there for the
// slowest worker, and that wait must not count as the faster worker's
// compute (the adaptive batch size and the autoscaling policies read it).
func TestCollectiveTimeIsWaiting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	go coord.Run(ctx)
	const steps = 20
	const slowCompute = 8 * time.Millisecond
	sinks := map[string]*statsSink{"fast": {}, "slow": {}}
	workers := map[string]*toyWorker{}
	for name := range sinks {
		workers[name] = startToy(t, name, coord, 64)
	}
	errs := make(chan error, 2)
	for name := range sinks {
		go func() {
			errs <- func() error {
				w := workers[name]
				sess, err := joinCoord(ctx, coord, name, w.tr, w.state, func(sc *Config) { sc.OnStats, sc.StatsEvery = sinks[name].add, 5 })
				if err != nil {
					return err
				}
				defer sess.Close()
				grads := collective.SliceBuffer(make([]float32, 64))
				for sess.Step() < steps {
					if name == "slow" {
						time.Sleep(slowCompute) // simulated compute: the other waits for it
					}
					if err := sess.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
						return c.Barrier(ctx)
					}); err != nil {
						return err
					}
					if err := sess.Allreduce(ctx, Reduction{}, grads); err != nil {
						return err
					}
					if err := sess.Commit(ctx); err != nil {
						return err
					}
				}
				if b, ok := sess.clock.Take(); ok {
					sinks[name].add(b)
				}
				return nil
			}()
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	median := map[string]time.Duration{}
	for name, sink := range sinks {
		var computes []time.Duration
		for _, b := range sink.batches {
			for _, st := range b.Steps {
				computes = append(computes, st.Compute)
			}
		}
		if len(computes) == 0 {
			t.Fatalf("%s reported no steps", name)
		}
		slices.Sort(computes)
		median[name] = computes[len(computes)/2]
	}
	if median["slow"] < slowCompute || median["fast"] > slowCompute/2 {
		t.Errorf("median compute: slow %v, fast %v; want the fast worker's wait in Collective out of its compute", median["slow"], median["fast"])
	}
}
