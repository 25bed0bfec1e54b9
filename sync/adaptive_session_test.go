package sync

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
)

// TestUseAdaptiveBatchOnADrivenSession: two workers driving their sessions
// themselves (as the language bindings' engine does), with the measurement
// off at the start: UseAdaptiveBatch turns it on, the gradients are noisy
// (a noise scale far above M0), and rank 0's decisions reach both workers
// at the same steps: the batch grows, and both run the same plans.
func TestUseAdaptiveBatchOnADrivenSession(t *testing.T) {
	const dim, m0 = 500, 16
	sessions, _ := noiseWorld(t, 2, NoiseConfig{})
	policies := make([]*AdaptiveBatch, len(sessions))
	for _, s := range sessions {
		cfg := DefaultAdaptiveConfig()
		cfg.InitBatch, cfg.MaxBatch, cfg.NoAccumulation = m0, 512, true
		cfg.DecideEvery, cfg.RefitEvery, cfg.MinSteps = 5*time.Millisecond, 20*time.Millisecond, 5
		a, err := NewAdaptiveBatch(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.UseAdaptiveBatch(a); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		policies[s.Rank()] = a
	}
	plans := make([][]BatchPlan, len(sessions))
	onEachSession(t, sessions, func(ctx context.Context, rank int, s *Session) error {
		r := rand.New(rand.NewPCG(uint64(rank)+1, 5))
		grad := make([]float32, dim)
		deadline := time.Now().Add(30 * time.Second)
		for grew := 0; grew < 20; {
			if time.Now().After(deadline) {
				return context.DeadlineExceeded
			}
			p := policies[rank].PlanBatch(Progress{Size: s.Size()})
			plans[rank] = append(plans[rank], p)
			if p.Global > m0 {
				grew++ // a few steps at the new size, then stop on both at once
			}
			s.SetGlobalBatch(p.Global)
			share := float64(p.Global) / float64(s.Size())
			for j := range grad {
				grad[j] = float32(0.01 + r.NormFloat64()/math.Sqrt(share))
			}
			// Compute that grows with the batch, so that larger batches
			// are not free either.
			for range int(share) * 2000 {
				r.Float64()
			}
			if err := s.Allreduce(ctx, Reduction{}, collective.SliceBuffer(grad)); err != nil {
				return err
			}
			if err := s.Commit(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if len(plans[0]) != len(plans[1]) {
		t.Fatalf("the workers ran %d and %d steps", len(plans[0]), len(plans[1]))
	}
	for i := range plans[0] {
		if plans[0][i] != plans[1][i] {
			t.Fatalf("step %d: rank 0 ran %+v, rank 1 %+v", i, plans[0][i], plans[1][i])
		}
	}
	last := plans[0][len(plans[0])-1]
	t.Logf("%d steps; the batch grew to %+v", len(plans[0]), last)
	if _, ok := sessions[0].GradientNoise(); !ok {
		t.Fatal("no gradient noise estimate")
	}
}

// A micro-batch norm that is not a finite number ≥ 0 leaves its step
// unmeasured.
func TestRecordMicroBatchNormRefusesNonsense(t *testing.T) {
	for _, sq := range []float64{-1, math.NaN(), math.Inf(1)} {
		g, err := newGradNoise(NoiseConfig{Measure: true, InitBatch: 8})
		if err != nil {
			t.Fatal(err)
		}
		g.recordMicroBatchNorm(1)
		g.recordMicroBatchNorm(sq)
		if !g.st.broken {
			t.Errorf("%v: the step is still measured", sq)
		}
	}
}
