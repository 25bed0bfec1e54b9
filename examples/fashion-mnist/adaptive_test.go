package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/sampler"
)

// stepRecords runs the trainer and returns its step and eval records.
func stepRecords(t *testing.T, args ...string) (steps, evals []map[string]any) {
	t.Helper()
	var out, progress bytes.Buffer
	if err := run(context.Background(), append(args, "--json", "--log-every", "0"), &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("stdout line %q is not JSON: %v", sc.Text(), err)
		}
		switch rec["kind"] {
		case "step":
			steps = append(steps, rec)
		case "eval":
			evals = append(evals, rec)
		}
	}
	return steps, evals
}

// A fixed batch above --lr-batch-size runs with the rule's factor: linear r,
// sqrt √r, AdaScale the gain, between 1 and r once the noise is measured.
func TestFixedBatchLearningRateRules(t *testing.T) {
	dir := writeDataDir(t, 96, 20)
	for _, tc := range []struct {
		rule   string
		lo, hi float64
	}{{"linear", 2, 2}, {"sqrt", math.Sqrt2, math.Sqrt2}, {"adascale", 1, 2}} {
		t.Run(tc.rule, func(t *testing.T) {
			steps, _ := stepRecords(t, "--data-dir", dir, "--epochs", "3", "--batch-size", "16", "--lr-batch-size", "8",
				"--lr-rule", tc.rule, "--hidden", "8", "--lr", "0.1")
			measured := 0
			for _, r := range steps {
				f := r["lr_factor"].(float64)
				if r["global_batch"].(float64) != 16 {
					t.Fatalf("global batch %v, want 16", r["global_batch"])
				}
				if f < tc.lo-1e-9 || f > tc.hi+1e-9 {
					t.Fatalf("step %v: factor %v outside [%v, %v]", r["step"], f, tc.lo, tc.hi)
				}
				if e, ok := r["efficiency"].(float64); ok {
					measured++
					// A batch of twice M0 is at most as efficient as M0 and
					// at least half as.
					if e > 1+1e-9 || e < 0.5-1e-9 {
						t.Fatalf("step %v: efficiency %v at r = 2", r["step"], e)
					}
				}
			}
			if measured == 0 {
				t.Fatal("no step reported the gradient statistics")
			}
		})
	}
	// Without the measurement there are no statistics, and the rules that need
	// none still apply.
	steps, _ := stepRecords(t, "--data-dir", dir, "--epochs", "1", "--batch-size", "16", "--lr-batch-size", "8",
		"--lr-rule", "linear", "--no-gradient-noise", "--hidden", "8")
	for _, r := range steps {
		if _, ok := r["efficiency"]; ok {
			t.Fatalf("statistics without the measurement: %v", r)
		}
	}
}

// The adaptive trainer starts at M0, reports the statistics and the plan,
// learns, and evaluates every --eval-every-samples with the samples counted
// across data epochs.
func TestAdaptiveRun(t *testing.T) {
	dir := writeDataDir(t, 200, 40)
	steps, evals := stepRecords(t, "--data-dir", dir, "--epochs", "4", "--batch-size", "8", "--adaptive", "--max-batch-size", "64",
		"--refit-every", "10ms", "--hidden", "8", "--lr", "0.3", "--eval-every-samples", "100")
	if len(steps) == 0 || steps[0]["global_batch"].(float64) != 8 || steps[0]["lr_factor"].(float64) != 1 {
		t.Fatalf("first step %v: want the initial batch 8 at factor 1", steps[0])
	}
	if got := steps[len(steps)-1]["trained_samples"].(float64); got != 4*200 {
		t.Fatalf("trained %v samples, want 800", got)
	}
	if len(evals) != 8 {
		t.Fatalf("%d evaluations, want one per 100 of 800 samples", len(evals))
	}
	for i, e := range evals {
		if s := e["trained_samples"].(float64); s < float64(100*(i+1)) || s >= float64(100*(i+1))+64 {
			t.Fatalf("evaluation %d after %v samples", i, s)
		}
	}
	if acc := evals[len(evals)-1]["test_accuracy"].(float64); acc < 0.8 {
		t.Fatalf("test accuracy %v", acc)
	}
}

// accumPlan is a batch policy of two micro-batches per step.
type accumPlan int

func (g accumPlan) PlanBatch(gsync.Progress) gsync.BatchPlan {
	return gsync.BatchPlan{Global: int(g), MicroBatch: int(g) / 2, Accum: 1}
}

// The micro-batch trainer leaves the gradient of the whole batch: the same as
// one ComputeGradients over the step's samples, to float32 rounding.
func TestMicroBatchesSumToTheBatchGradient(t *testing.T) {
	train, _, err := mnist.Load(writeDataDir(t, 64, 10))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mnist.DefaultConfig()
	cfg.Inputs, cfg.Hidden = train.Features(), 8
	model, err := mnist.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := mnist.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	order, err := sampler.New(sampler.Config{N: train.N, Seed: 1, Shuffle: true})
	if err != nil {
		t.Fatal(err)
	}
	micro := &microBatchTrainer{model: model, train: train}
	checked := 0
	_, err = gsync.Train(context.Background(), gsync.TrainConfig{Data: order, Epochs: 1, BatchPolicy: accumPlan(16)}, gsync.NewState(),
		func(ctx context.Context, s *gsync.TrainStep) error {
			r, err := micro.step(s)
			if err != nil {
				return err
			}
			x, y, err := train.Gather(s.Batch.Indices, nil, nil)
			if err != nil {
				return err
			}
			whole, err := ref.ComputeGradients(x, y, 1/float32(len(y)))
			if err != nil {
				return err
			}
			if r.N != whole.N || r.Correct != whole.Correct || math.Abs(r.LossSum-whole.LossSum) > 1e-4*math.Abs(whole.LossSum) {
				t.Errorf("step %d: micro-batches %+v, whole batch %+v", s.Number, r, whole)
			}
			for i, g := range model.Grads() {
				if d := math.Abs(float64(g - ref.Grads()[i])); d > 1e-5+1e-4*math.Abs(float64(g)) {
					t.Fatalf("step %d: gradient %d is %v, the whole batch's %v", s.Number, i, g, ref.Grads()[i])
				}
			}
			checked++
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if checked != 4 {
		t.Fatalf("%d steps checked, want 4", checked)
	}
}
