package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
	"github.com/gorovod/gorovod/heuristics/goodput"
	gsync "github.com/gorovod/gorovod/sync"
)

// batchOptions are the batch-size and learning-rate settings (AdaptDL's
// adaptive batch size and learning-rate rules).
type batchOptions struct {
	adaptive      bool
	maxBatch      int
	maxMicroBatch int
	lrRule        string
	lrBatch       int
	noGNS         bool
	evalEvery     int
	refitEvery    time.Duration

	rule goodput.LRRule // parsed lrRule
}

func (b *batchOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&b.adaptive, "adaptive", false, "learn the batch size as training goes (AdaptDL/Pollux goodput), starting from --batch-size")
	fs.IntVar(&b.maxBatch, "max-batch-size", 0, "with --adaptive: the largest global batch (0: 16 × --batch-size)")
	fs.IntVar(&b.maxMicroBatch, "max-micro-batch", 0, "with --adaptive: the most samples one worker computes at once, its memory limit (0: no limit below --max-batch-size); beyond it the worker accumulates gradients")
	fs.DurationVar(&b.refitEvery, "refit-every", gsync.DefaultAdaptiveConfig().RefitEvery, "with --adaptive: how often the throughput model is fitted again to the measured steps")
	fs.StringVar(&b.lrRule, "lr-rule", "adascale", "how the learning rate scales with the batch size relative to --lr-batch-size: adascale (the gain from the measured gradient noise), sqrt or linear")
	fs.IntVar(&b.lrBatch, "lr-batch-size", 0, "the global batch --lr is tuned for, M0 (0: --batch-size); a fixed --batch-size above it runs with the rule's factor")
	fs.BoolVar(&b.noGNS, "no-gradient-noise", false, "turn off the gradient noise measurement (no goodput statistics, no --adaptive; fixed batches run at --lr)")
	fs.IntVar(&b.evalEvery, "eval-every-samples", 0, "also evaluate on the test set each time this many more samples have been trained (0: only per data epoch)")
}

func (b *batchOptions) check(batch int) error {
	var err error
	if b.rule, err = goodput.ParseLRRule(b.lrRule); err != nil {
		return fmt.Errorf("--lr-rule: %w", err)
	}
	switch {
	case b.maxBatch < 0 || b.maxMicroBatch < 0 || b.lrBatch < 0 || b.evalEvery < 0 || b.refitEvery <= 0:
		return errors.New("--max-batch-size, --max-micro-batch, --lr-batch-size and --eval-every-samples must be ≥ 0, --refit-every > 0")
	case b.adaptive && b.noGNS:
		return errors.New("--adaptive needs the gradient noise measurement: drop --no-gradient-noise")
	case !b.adaptive && (b.maxBatch != 0 || b.maxMicroBatch != 0):
		return errors.New("--max-batch-size and --max-micro-batch need --adaptive")
	case b.adaptive && b.lrBatch != 0 && b.lrBatch != batch:
		return errors.New("--lr-batch-size with --adaptive: the adaptive batch starts at --batch-size, which is M0")
	}
	if b.lrBatch == 0 {
		b.lrBatch = batch
	}
	if b.adaptive && b.maxBatch == 0 {
		b.maxBatch = 16 * batch
	}
	if b.adaptive && b.maxBatch < batch {
		return fmt.Errorf("--max-batch-size %d < --batch-size %d", b.maxBatch, batch)
	}
	return nil
}

// configure sets the loop's batch policy and gradient noise measurement.
func (b *batchOptions) configure(loop *gsync.TrainConfig, batch int, log *slog.Logger) error {
	loop.NoGradientNoise = b.noGNS
	if !b.adaptive {
		loop.GlobalBatch = batch
		loop.Worker.Session.GradientNoise.InitBatch = b.lrBatch
		return nil
	}
	cfg := gsync.DefaultAdaptiveConfig()
	cfg.InitBatch, cfg.MaxBatch, cfg.MaxMicroBatch, cfg.LRRule = batch, b.maxBatch, b.maxMicroBatch, b.rule
	cfg.RefitEvery = b.refitEvery
	if log != nil {
		cfg.Logger = log
	}
	policy, err := gsync.NewAdaptiveBatch(cfg)
	if err != nil {
		return err
	}
	loop.BatchPolicy = policy
	return nil
}

// lrFactor is the step's learning-rate multiplier: the adaptive policy's
// (in its plan), or for a fixed batch the rule's at the batch over
// --lr-batch-size, AdaScale's gain from the measured statistics (before the
// first estimate, or without the measurement, the gain of a gradient all
// noise: linear).
func (b *batchOptions) lrFactor(s *gsync.TrainStep) float64 {
	if b.adaptive || s.Batch.Global == b.lrBatch {
		return s.Plan.LRScale()
	}
	if b.noGNS {
		return 1
	}
	grad, _ := s.Session.GradientNoise()
	return b.rule.Factor(grad, float64(s.Batch.Global)/float64(b.lrBatch))
}

// efficiency is the statistical efficiency of the step's batch relative to
// M0 by the newest statistics (NaN before the first estimate).
func (b *batchOptions) efficiency(s *gsync.TrainStep) (eff, sqr, variance float64) {
	grad, ok := s.Session.GradientNoise()
	if !ok {
		return math.NaN(), math.NaN(), math.NaN()
	}
	return grad.Efficiency(float64(s.Batch.Global) / float64(b.lrBatch)), grad.Sqr, grad.Var
}

// microBatchTrainer computes a step's gradients over the plan's
// micro-batches: each micro-batch's mean gradient goes to the gradient
// noise measurement (Session.RecordMicroBatch), and their sum, weighted by
// their sizes, is left in the model's gradients, scaled like a single
// micro-batch's (size/global) for the averaging allreduce.
type microBatchTrainer struct {
	model *mnist.MLP
	train *mnist.Set
	acc   []float32
	x     []float32
	y     []uint8
}

func (t *microBatchTrainer) step(s *gsync.TrainStep) (mnist.Result, error) {
	var total mnist.Result
	grads := t.model.Grads()
	if len(t.acc) != len(grads) {
		t.acc = make([]float32, len(grads))
	}
	clear(t.acc)
	buf := collective.SliceBuffer(grads)
	for _, mb := range s.MicroBatches() {
		if len(mb) == 0 {
			continue
		}
		var err error
		if t.x, t.y, err = t.train.Gather(mb, t.x, t.y); err != nil {
			return total, err
		}
		r, err := t.model.ComputeGradients(t.x, t.y, 1/float32(len(mb)))
		if err != nil {
			return total, err
		}
		if err := s.Session.RecordMicroBatch(buf); err != nil {
			return total, err
		}
		w := float32(len(mb)) * float32(s.Size) / float32(s.Batch.Global)
		for i, g := range grads {
			t.acc[i] += w * g
		}
		total.LossSum += r.LossSum
		total.Correct += r.Correct
		total.N += r.N
	}
	copy(grads, t.acc)
	return total, nil
}

// evaluator runs the test-set evaluations every --eval-every-samples on
// rank 0, and keeps their time out of the training time it reports.
type evaluator struct {
	every   int
	next    int
	evalDur float64 // seconds spent evaluating so far
}

func (e *evaluator) due(samples int) bool {
	if e.every <= 0 {
		return false
	}
	if e.next == 0 {
		e.next = e.every
	}
	if samples < e.next {
		return false
	}
	for e.next <= samples {
		e.next += e.every
	}
	return true
}

// describeAdaptive is the adaptive policy's newest model, for the final
// report (rank 0 fits; "" for a fixed batch).
func describeAdaptive(policy gsync.BatchPolicy) string {
	a, ok := policy.(*gsync.AdaptiveBatch)
	if !ok {
		return ""
	}
	st := a.Status()
	if st.Refits == 0 {
		return "adaptive batch: the throughput model was never fitted (too few steps, or not rank 0)"
	}
	m := st.Model
	return fmt.Sprintf("adaptive batch: %d fits (last on %d configurations), noise scale %.4g, T_acc(m) = %.3g + %.3g·m s; best on %d workers: batch %d (micro-batch %d × %d) at %.4g samples/s goodput, ×%.3f over the plan in force",
		st.Refits, st.Configurations, m.Grad.NoiseScale(m.InitBatch), m.Perf.AlphaC, m.Perf.BetaC,
		st.Replicas, st.Choice.Batch(st.Replicas), st.Choice.MicroBatch, st.Choice.Accum+1, st.Choice.Goodput, st.Speedup)
}
