package sync

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

func newAdaptive(t testing.TB, cfg AdaptiveConfig) *AdaptiveBatch {
	t.Helper()
	a, err := NewAdaptiveBatch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The split of a global batch over a world, worked out by hand: shares
// rounded up, accumulation once a share exceeds the largest micro-batch (and
// alone once the batch exceeds M0), micro-batches kept within bounds.
func TestAdaptiveSplit(t *testing.T) {
	tests := []struct {
		name               string
		cfg                AdaptiveConfig
		global, k          int
		wantMicro, wantAcc int
		wantGlobal         int
	}{
		{"M0 alone", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024}, 64, 1, 64, 0, 64},
		{"M0 over four", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024}, 64, 4, 16, 0, 64},
		{"uneven share rounds up", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024}, 64, 3, 22, 0, 66},
		{"alone above M0 accumulates", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024}, 256, 1, 128, 1, 256},
		{"over the micro-batch limit", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024, MaxMicroBatch: 100}, 1000, 2, 100, 4, 1000},
		{"share of 250 in 3 micro-batches", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024, MaxMicroBatch: 100}, 500, 2, 84, 2, 504},
		{"no accumulation caps the micro-batch", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024, MaxMicroBatch: 100, NoAccumulation: true}, 1000, 2, 100, 0, 200},
		{"below the smallest micro-batch", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024, MinMicroBatch: 32}, 64, 4, 32, 0, 128},
		// 1024 over 3 rounded up is 3×342 = 1026 (a run of the goodput
		// test trained with it): the shares are rounded down instead.
		{"the largest batch over three", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024}, 1024, 3, 341, 0, 1023},
		{"the largest batch over three, accumulating", AdaptiveConfig{InitBatch: 64, MaxBatch: 1024, MaxMicroBatch: 100}, 1024, 3, 85, 3, 1020},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAdaptive(t, tc.cfg)
			m, s := a.split(tc.global, tc.k)
			if m != tc.wantMicro || s != tc.wantAcc || tc.k*m*(s+1) != tc.wantGlobal {
				t.Fatalf("split(%d, %d) = micro %d, accum %d (global %d); want %d, %d (%d)", tc.global, tc.k, m, s, tc.k*m*(s+1), tc.wantMicro, tc.wantAcc, tc.wantGlobal)
			}
		})
	}
}

// The integer split agrees with the goodput search's own rule wherever the
// search can land: a worker's share of a global batch the optimizer picked
// splits into the same micro-batch and accumulation.
func TestAdaptiveSplitMatchesOptimize(t *testing.T) {
	model := goodput.Model{Perf: goodput.PerfParams{AlphaC: 0.01, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.01, AlphaR: 0.02, BetaR: 0.005, Gamma: 1.5},
		Grad: goodput.GradParams{Sqr: 1, Var: 3}, InitBatch: 32}
	for _, cfg := range []AdaptiveConfig{{InitBatch: 32, MaxBatch: 4096, MaxMicroBatch: 256}, {InitBatch: 32, MaxBatch: 600, MaxMicroBatch: 64}} {
		a := newAdaptive(t, cfg)
		for k := 1; k <= 8; k++ {
			c, ok := model.Optimize(k, k, cfg.limits())
			if !ok {
				continue
			}
			if m, s := a.split(c.Batch(k), k); m != c.MicroBatch || s != c.Accum {
				t.Errorf("%+v, %d workers: optimum %d×%d×%d, split gives %d×%d", cfg, k, k, c.MicroBatch, c.Accum+1, m, s+1)
			}
		}
	}
}

// Rank 0's learning-rate factor follows the rule, as a multiple of 2^-16.
func TestAdaptiveLRFactor(t *testing.T) {
	grad := goodput.GradParams{Sqr: 1, Var: 3} // gain at r: 4/(3/r + 1)
	tests := []struct {
		rule goodput.LRRule
		want float64 // at r = 4: 64 samples of M0 16
	}{
		{goodput.AdaScale, 4 / (3.0/4 + 1)},
		{goodput.SqrtScale, 2},
		{goodput.LinearScale, 4},
	}
	for _, tc := range tests {
		a := newAdaptive(t, AdaptiveConfig{InitBatch: 16, MaxBatch: 256, LRRule: tc.rule})
		a.PlanBatch(Progress{Size: 2})
		a.best, a.bestFor = goodput.Choice{MicroBatch: 32}, 2
		d, ok := a.propose(grad, true)
		if !ok || d.Micro != 32 || d.Accum != 0 || math.Abs(d.LRFactor-tc.want) > 0x1p-16 || d.LRFactor != math.Ldexp(math.Round(math.Ldexp(d.LRFactor, 16)), -16) {
			t.Errorf("%v: %+v, %v; want micro 32 and factor %v", tc.rule, d, ok, tc.want)
		}
	}
	// Before any gradient statistics, no gain.
	a := newAdaptive(t, AdaptiveConfig{InitBatch: 16, MaxBatch: 256})
	a.PlanBatch(Progress{Size: 1})
	if d, _ := a.propose(goodput.GradParams{}, false); d.LRFactor != 1 || d.Micro != 16 {
		t.Errorf("without statistics: %+v", d)
	}
}

func TestAdaptiveConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  AdaptiveConfig
	}{
		{"no M0", AdaptiveConfig{}},
		{"max below M0", AdaptiveConfig{InitBatch: 64, MaxBatch: 32}},
		{"empty micro-batch bounds", AdaptiveConfig{InitBatch: 64, MinMicroBatch: 10, MaxMicroBatch: 5}},
		{"negative refit", AdaptiveConfig{InitBatch: 64, RefitEvery: -time.Second}},
		{"unknown rule", AdaptiveConfig{InitBatch: 64, LRRule: 7}},
		{"beyond the side-car", AdaptiveConfig{InitBatch: 64, MaxBatch: 1 << 25}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewAdaptiveBatch(tc.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v, want ErrInvalidConfig", err)
			}
		})
	}
	a := newAdaptive(t, AdaptiveConfig{InitBatch: 8})
	st := NewState()
	_, err := Train(context.Background(), TrainConfig{Steps: 1, BatchPolicy: a, NoGradientNoise: true}, st, func(context.Context, *TrainStep) error { return nil })
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("adaptive without the measurement: %v", err)
	}
	for _, bad := range []string{`[`, `{"target":0,"lr_factor":1}`, `{"target":8,"micro":-1,"lr_factor":1}`, `{"target":8,"lr_factor":0}`} {
		if err := a.unmarshal([]byte(bad)); err == nil {
			t.Errorf("state %s accepted", bad)
		}
	}
}

// Workers train with the adaptive policy while rank 0's choices change the
// batch size every few steps and the world changes under them (a worker
// joins, one dies mid-step): every worker runs every step with the same
// plan, each new choice takes effect at the next step, every sample of each
// data epoch is trained on exactly once, and the parameters agree.
func TestAdaptiveDecisionsAcrossWorldChanges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	log := &loopLog{}
	// Choices rank 0's model "makes" (forced below): micro-batch and
	// accumulation, whatever the world.
	choices := []goodput.Choice{{MicroBatch: 2}, {MicroBatch: 4, Accum: 1}, {MicroBatch: 3, Accum: 2}, {MicroBatch: 8}, {MicroBatch: 5, Accum: 1}}
	var mu stdsync.Mutex
	forced := map[int64]goodput.Choice{} // step → the choice rank 0 held while running it
	policies := map[string]*AdaptiveBatch{}
	newPolicy := func(name string) *AdaptiveBatch {
		a := newAdaptive(t, AdaptiveConfig{InitBatch: 12, MaxBatch: 60, MaxMicroBatch: 8, DecideEvery: time.Hour})
		mu.Lock()
		policies[name] = a
		mu.Unlock()
		return a
	}
	var wg stdsync.WaitGroup
	errs := make(chan error, 4)
	var joined stdsync.Once
	var start func(name string, kill bool)
	start = func(name string, kill bool) {
		w := newLoopWorker(t, name, log, func(c *TrainConfig) { c.GlobalBatch, c.BatchPolicy, c.Epochs = 0, newPolicy(name), 3 })
		wg.Go(func() {
			_, err := w.train(ctx, t, coord, nil, func(ctx context.Context, s *TrainStep) error {
				if kill && s.Number >= 10 && s.Size >= 3 {
					return errKilled
				}
				if s.Number == 4 && s.Rank == 0 {
					// A third joins mid-training: the world holds this
					// step until it is in.
					joined.Do(func() {
						start("a2", false)
						waitEpoch(t, coord, func(e epoch.World) bool { return e.Rank("a2") >= 0 })
					})
				}
				if s.Rank == 0 && s.Number%3 == 0 {
					c := choices[int(s.Number/3)%len(choices)]
					a := policies[name]
					a.mu.Lock()
					a.best, a.bestFor = c, s.Size
					a.mu.Unlock()
					mu.Lock()
					forced[s.Number] = c
					mu.Unlock()
				}
				return w.step(ctx, s)
			})
			if kill && errors.Is(err, errKilled) {
				err = nil
			}
			errs <- err
		})
	}
	start("a0", false)
	start("a1", true)
	waitEpoch(t, coord, func(e epoch.World) bool { return len(e.Members) == 2 })
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	checkLoopLog(t, log, 3)

	log.mu.Lock()
	defer log.mu.Unlock()
	redone := false
	for _, r := range log.steps {
		redone = redone || r.attempt > 0
	}
	if !redone {
		t.Error("no step was redone, though a worker died mid-step")
	}
	plans := map[int64]loopRecord{}
	globals := map[int]bool{}
	sizes := map[int]bool{}
	for _, r := range log.steps {
		p := r.plan
		if p.Global != r.size*p.MicroBatch*(p.Accum+1) || r.batch.Global > p.Global {
			t.Fatalf("%s step %d: plan %+v in a world of %d trained %d samples", r.worker, r.step, p, r.size, r.batch.Global)
		}
		if first, ok := plans[r.step]; ok && (first.plan != p || first.size != r.size) {
			t.Fatalf("step %d: %s ran plan %+v with %d workers, %s plan %+v with %d", r.step, first.worker, first.plan, first.size, r.worker, p, r.size)
		}
		plans[r.step] = r
		globals[p.Global] = true
		sizes[r.size] = true
	}
	// A choice held while step n ran is the plan of step n+1, when the
	// world did not change between them (it is split anew when it does).
	followed := 0
	for n, c := range forced {
		this, next := plans[n], plans[n+1]
		if next.step == 0 || next.size != this.size || next.world != this.world {
			continue
		}
		if next.plan.MicroBatch != c.MicroBatch || next.plan.Accum != c.Accum {
			t.Fatalf("step %d held choice %+v, step %d ran %+v", n, c, n+1, next.plan)
		}
		followed++
	}
	if followed < 3 || len(globals) < 4 || len(sizes) < 2 {
		t.Fatalf("%d choices followed, global batches %v, world sizes %v: not enough change to test", followed, globals, sizes)
	}
	t.Logf("%d steps, %d choices followed, global batches %v, world sizes %v", len(plans), followed, slices.Sorted(mapsKeys(globals)), slices.Sorted(mapsKeys(sizes)))
}

func mapsKeys(m map[int]bool) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Alone, on a problem whose gradient is mostly noise and whose steps cost
// mostly a fixed overhead, the model finds that larger batches are worth it:
// the policy grows the batch above M0, with accumulation (so the noise has
// micro-batches to come from) and an AdaScale factor above 1, all through
// the real background goroutine.
func TestAdaptiveGrowsTheBatchWhenNoiseAllows(t *testing.T) {
	if UnderLauncher() {
		t.Skip("the test process was started by a launcher")
	}
	a := newAdaptive(t, AdaptiveConfig{InitBatch: 8, MaxBatch: 256, MaxMicroBatch: 64, DecideEvery: 20 * time.Millisecond, RefitEvery: 100 * time.Millisecond, MinSteps: 5})
	st := NewState()
	w := make([]float32, 256)
	st.RegisterTensor("w", w)
	g := make([]float32, len(w))
	r := rand.New(rand.NewPCG(1, 2))
	var plans []BatchPlan
	cfg := TrainConfig{Steps: 400, BatchPolicy: a, NoLeaveSignal: true}
	cfg.Committed = func(ctx context.Context, s *TrainStep) error {
		plans = append(plans, s.Plan)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := Train(ctx, cfg, st, func(ctx context.Context, s *TrainStep) error {
		// A micro-batch of m samples: 2 ms of overhead plus 10 µs a sample;
		// its mean gradient 0.01 per coordinate plus noise of per-sample
		// variance 1.
		mean := make([]float64, len(g))
		for range s.Plan.Accum + 1 {
			time.Sleep(2*time.Millisecond + time.Duration(s.Plan.MicroBatch)*10*time.Microsecond)
			for j := range g {
				g[j] = float32(0.01 + r.NormFloat64()/math.Sqrt(float64(s.Plan.MicroBatch)))
				mean[j] += float64(g[j]) / float64(s.Plan.Accum+1)
			}
			if s.Plan.Accum > 0 {
				if err := s.Session.RecordMicroBatch(collective.SliceBuffer(g)); err != nil {
					return err
				}
			}
		}
		for j := range g {
			g[j] = float32(mean[j])
		}
		if err := s.Session.Allreduce(ctx, Reduction{}, collective.SliceBuffer(g)); err != nil {
			return err
		}
		lr := 0.01 * s.Plan.LRScale()
		for j := range w {
			w[j] -= float32(lr) * g[j]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	last := plans[len(plans)-1]
	grew := 0
	for _, p := range plans {
		if p.Global > 8 {
			grew++
			if p.Accum < 1 || p.LRFactor <= 1 {
				t.Fatalf("alone above M0 without accumulation or gain: %+v", p)
			}
		}
	}
	st2 := a.Status()
	t.Logf("last plan %+v after %d steps (%d above M0); model %+v, %d refits", last, len(plans), grew, st2.Model, st2.Refits)
	if grew == 0 || last.Global <= 8 {
		t.Fatalf("the batch never grew: last plan %+v", last)
	}
	if st2.Refits < 2 || st2.Model.Grad.Var <= st2.Model.Grad.Sqr {
		t.Fatalf("model %+v after %d refits: want several refits and noise above signal", st2.Model, st2.Refits)
	}
}

// The policy's state is the job's: a joiner receives the plan in force.
func TestAdaptiveStateRoundTrip(t *testing.T) {
	a := newAdaptive(t, AdaptiveConfig{InitBatch: 16, MaxBatch: 128})
	a.PlanBatch(Progress{Size: 2})
	a.committed(stepCommit{Decided: true, Decision: batchDecision{Micro: 24, Accum: 1, LRFactor: 1.5}, Replicas: 2})
	b, err := a.marshal()
	if err != nil {
		t.Fatal(err)
	}
	j := newAdaptive(t, AdaptiveConfig{InitBatch: 16, MaxBatch: 128})
	if err := j.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	want := BatchPlan{Global: 96, MicroBatch: 24, Accum: 1, LRFactor: 1.5}
	if got := j.PlanBatch(Progress{Size: 2}); got != want {
		t.Fatalf("joiner's plan %+v, want %+v", got, want)
	}
	// In a world of three the same global batch is split anew.
	if got := j.PlanBatch(Progress{Size: 3}); got.Global != 96 || got.MicroBatch != 32 || got.Accum != 0 {
		t.Fatalf("over three workers: %+v", got)
	}
}
