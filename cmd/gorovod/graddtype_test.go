package main

import (
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// A trainer written on sync.Train trains Fashion-MNIST elastically with its
// gradients averaged in float16 or bfloat16 as well as in float32: under
// `gorovod run`, with a worker leaving mid-run, every worker holds the same
// parameters at every step of every world, and the test accuracy lands in
// float32's band.
func TestFashionMNISTGradDTypesUnderRun(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	accuracy := map[string]float64{}
	for _, dtype := range []string{"float32", "float16", "bfloat16"} {
		t.Run(dtype, func(t *testing.T) {
			// The whole training set, so that the third worker joins well
			// before the end even on a loaded machine.
			h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--", e2e.FashionMNIST, "--epochs", "1",
				"--json", "--log-every", "0", "--grad-dtype", dtype, "-v")
			h.WaitFor(t, "a 3-worker world", 90*time.Second, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == 3 })
			h.Mu.Lock()
			s := e2e.MaxStep(h.Lines)
			h.Mu.Unlock()
			syscall.Kill(h.Pid(t, 0), syscall.SIGTERM) // a graceful leave
			h.WaitFor(t, "a 2-worker world after SIGTERM", 60*time.Second, e2e.SizeAfter(s, 2))
			select {
			case err := <-h.Exited:
				if err != nil {
					t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
				}
			case <-time.After(2 * time.Minute):
				h.Mu.Lock()
				defer h.Mu.Unlock()
				t.Fatalf("job did not finish (last step %d); launcher log:\n%s", e2e.MaxStep(h.Lines), h.Log.String())
			}
			h.Mu.Lock()
			defer h.Mu.Unlock()
			type key struct {
				step  int64
				world uint64
			}
			hashes := map[key]string{}
			steps := map[int64]bool{}
			sizes := map[int]bool{}
			for _, l := range h.Lines {
				if l.Size == 0 {
					continue // the epoch and final records
				}
				k := key{l.Step, l.WorldEpoch}
				if prev, ok := hashes[k]; ok && prev != l.Params {
					t.Fatalf("step %d, world epoch %d: the workers hold different parameters", l.Step, l.WorldEpoch)
				}
				hashes[k] = l.Params
				steps[l.Step], sizes[l.Size] = true, true
			}
			for _, l := range h.Lines {
				if l.Accuracy > 0 {
					accuracy[dtype] = l.Accuracy // the last is the final record's
				}
			}
			// An epoch of 60000 samples in global batches of 64.
			if len(steps) != 938 || !sizes[2] || !sizes[3] {
				t.Fatalf("%d steps, world sizes %v: want 938 steps in worlds of 3 and 2", len(steps), sizes)
			}
			t.Logf("%s gradients: test accuracy %.2f%%", dtype, 100*accuracy[dtype])
		})
	}
	if t.Failed() || len(accuracy) != 3 {
		return
	}
	if accuracy["float32"] < 0.8 {
		t.Fatalf("float32 gradients: test accuracy %.3f after an epoch", accuracy["float32"])
	}
	// Half-precision gradients change the rounding, not the learning.
	for _, dtype := range []string{"float16", "bfloat16"} {
		if d := math.Abs(accuracy[dtype] - accuracy["float32"]); d > 0.02 {
			t.Errorf("%s gradients: test accuracy %.3f, float32's %.3f", dtype, accuracy[dtype], accuracy["float32"])
		}
	}
}
