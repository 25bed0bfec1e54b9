package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/heuristics"
)

// The real example trainer, learning its batch size (--adaptive), runs under
// the goodput heuristic: the engine's decisions come from the throughput
// model fitted to the measured steps and the gradient statistics the
// workers measured in their allreduces. From one worker the fitted model
// (one size measured, no sync time seen) predicts a gain at two, so the
// engine explores two; its next decisions are fitted on both sizes. Training
// still agrees across workers and learns.
func TestFashionMNISTUnderGoodput(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	h, evs := runAutoscaled(t, e2e.Binary,
		[]string{"--np", "1", "--max-np", "3", "--heuristic", "goodput",
			// No straggler replacements: on a loaded machine one came right
			// after the growth, and the job (8 s) ended before its
			// replacement joined, with no decision fitted after the growth.
			"--straggler-threshold", "0.05",
			"--heuristic-opt", "min_steps=20", "--heuristic-opt", "eval_every=10",
			// The trainer's limits: M0, the largest batch, and accumulation
			// (the adaptive trainer accumulates; alone, beyond M0, always).
			"--heuristic-opt", "init_batch=64", "--heuristic-opt", "max_batch=1024", "--heuristic-opt", "accumulation=true"},
		e2e.FashionMNIST, "--epochs", "2", "--json", "--log-every", "0",
		"--adaptive", "--max-batch-size", "1024", "--refit-every", "1s",
		// The elastic layer's decisions (worlds entered, rollbacks, batch
		// sizes) in the log a failure prints.
		"-v")
	e2e.LogDecisions(t, evs)
	defer func() {
		if t.Failed() {
			log := h.LogText()
			t.Logf("the launcher log's last 32 KiB:\n%s", log[max(0, len(log)-32<<10):])
		}
	}()
	var grew bool
	// The configurations (worker count and batch) each decision after the
	// first growth was fitted on: on a loaded machine a shrink may come
	// first and add configurations, so any number above one shows the
	// sizes explored in the fit.
	var fitted []int
	for _, ev := range evs {
		d := ev.Decision
		// The decisions as made (a "done" event repeats one in the new world).
		if d == nil || (ev.Kind != heuristics.EventDecision && ev.Kind != heuristics.EventSettled) || !strings.HasPrefix(d.Reason, "fitted on") {
			continue
		}
		n := d.Numbers
		if !(n["grad_sqr"] > 0 && n["grad_var"] > 0 && n["noise_scale"] > 0 && n["alpha_c"] > 0 && n["beta_c"] > 0) {
			t.Fatalf("decision at step %d without measured gradient statistics or a fitted model: %v", ev.Step, n)
		}
		if n["init_batch"] != 64 || n["workers"] != float64(ev.Workers) {
			t.Fatalf("decision at step %d: %v", ev.Step, n)
		}
		if grew {
			fitted = append(fitted, int(n["configurations"]))
		}
		if d.Action == heuristics.Grow {
			grew = true
		}
	}
	if !grew {
		t.Fatal("the fitted model never grew the job from one worker")
	}
	if slices.Max(append(fitted, 0)) < 2 {
		t.Fatalf("no decision after the job grew was fitted on the sizes explored (configurations seen: %v)", fitted)
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	checkFashionMNIST(t, h.Lines, 0.7)
	// The adaptive trainer reports its plan; every global batch is within
	// the limits.
	for _, l := range h.Lines {
		if l.Size > 0 && l.Params != "" && (l.GlobalBatch < 1 || l.GlobalBatch > 1024) {
			t.Fatalf("step %d ran with a global batch of %d", l.Step, l.GlobalBatch)
		}
	}
}
