package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/heuristics"
)

// The synthetic workload's known curve: a global batch of 64 samples at
// 1.5 ms each, split over k workers, plus 2 ms per step that does not shrink
// and 10 ms per worker beyond the first (a ring's latency term):
//
//	t(k) = 96/k + 2 + 10(k−1) ms  →  t = 98, 60, 54, 56, 61.2, 68 ms for k = 1..6
//	R(k) = 64/t(k)                →  R = 653, 1067, 1185, 1143, 1046, 941 samples/s
//
// plus the real allreduce of 16 KiB and process switching on a shared
// machine, measured at about a millisecond per step.
var knownCurve = []string{"--compute", "1500us", "--step-overhead", "2ms", "--overhead-per-worker", "10ms", "--model-size", "4096", "--batch", "64"}

// runAutoscaled runs a synthetic job under `launcher run --json` to the end
// and returns the trainer lines and the engine's events, the summary last.
func runAutoscaled(t *testing.T, launcher string, runArgs []string, trainer string, trainerArgs ...string) (*e2e.RunJobHarness, []e2e.EngineEvent) {
	t.Helper()
	args := append(append([]string{"--json"}, runArgs...), "--", trainer)
	h := e2e.StartRunJobWith(t, launcher, append(args, trainerArgs...)...)
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(3 * time.Minute):
		h.Mu.Lock()
		progress := fmt.Sprintf("%d trainer lines up to step %d; engine events:\n%s", len(h.Lines), e2e.MaxStep(h.Lines), strings.Join(h.Events, "\n"))
		h.Mu.Unlock()
		t.Logf("job did not finish: %s", progress)
		h.TimedOut(t, "the job to finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	evs := h.EngineEventsLocked(t)
	if len(evs) == 0 || evs[len(evs)-1].Kind != "summary" {
		t.Fatalf("no summary line; launcher log:\n%s", h.Log.String())
	}
	return h, evs
}

// settlesOnKnownCurve runs the synthetic job with the known curve under the
// given autoscaling flags, checks that it settles at want workers and that
// training stayed consistent, and returns the run's summary.
func settlesOnKnownCurve(t *testing.T, launcher string, runArgs []string, steps int64, want int) heuristics.Summary {
	t.Helper()
	h, evs := runAutoscaled(t, launcher, runArgs, e2e.Synthetic, append([]string{"--steps", fmt.Sprint(steps), "--json"}, knownCurve...)...)
	e2e.LogDecisions(t, evs)
	s := evs[len(evs)-1].Summary
	if s.SettledAfter < 0 || s.SettledWorkers != want {
		t.Fatalf("settled at %d workers after %.1f s, want %d", s.SettledWorkers, s.SettledAfter, want)
	}
	t.Logf("target found %.1f s (step %d) after the first world formed; run %.1f s", s.SettledAfter, s.SettledStep, s.Elapsed)
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, 4096, steps)
	return s
}

// scalingTarget is where the scaling-efficiency search must settle on a
// measured curve: the largest k whose step from k−1 passes.
func scalingTarget(ms []heuristics.Measurement, threshold float64) int {
	r := map[int]float64{}
	for _, m := range ms {
		r[m.Workers] = m.Throughput
	}
	best := 1
	for k := 2; r[k] > 0 && r[k-1] > 0; k++ {
		if (r[k]-r[k-1])/(r[k-1]/float64(k-1)) > threshold {
			best = k
		} else {
			break
		}
	}
	return best
}

// From one worker, scaling efficiency must settle at 3: by the curve above,
// adding the 2nd worker gains (1067−653)/653 = 0.63 of a worker's
// throughput, the 3rd (1185−1067)/(1067/2) = 0.22, the 4th
// (1143−1185)/(1185/3) = −0.11. The threshold 0.05 sits low in that gap
// because a loaded machine (CI runs packages in parallel) slows bigger worlds
// more, which lowers both.
func TestAutoscaleScalingEfficiencyFindsTarget(t *testing.T) {
	const threshold = 0.05
	s := settlesOnKnownCurve(t, e2e.Binary, []string{"--np", "1", "--max-np", "6", "--heuristic", "scaling-efficiency",
		"--heuristic-opt", fmt.Sprint("threshold=", threshold),
		"--heuristic-opt", "min_steps=15", "--heuristic-opt", "eval_every=5"}, 300, 3)
	if got := scalingTarget(s.Throughput, threshold); got != 3 {
		t.Errorf("the measured curve's target is %d workers, not the 3 worked out by hand: %+v", got, s.Throughput)
	}
	// Each size costs 3 skipped + 15 measured steps and its transition; the
	// search visits 1, 5, 6, 5, 4, 3, 2, 3.
	if s.SettledStep > 300 {
		t.Errorf("settled at step %d, want within 300 steps", s.SettledStep)
	}
}

// Utility versus cost with a linear utility of 20 per hour sooner and a price
// of 10 per worker-hour: net utility is a constant minus b·t(k)·(20 + 10k)/3600
// for b remaining steps, so the best k minimizes t(k)·(20 + 10k):
//
//	k=1: 98·30 = 2940   k=2: 60·40 = 2400   k=3: 54·50 = 2700   k=4: 56·60 = 3360
//
// The search settles at 2: going 1→2 passes (ΔU > ΔC), 2→3 does not.
func TestAutoscaleUtilityCostSettlesAtHandCalculation(t *testing.T) {
	settlesOnKnownCurve(t, e2e.Binary, []string{"--np", "1", "--max-np", "4", "--heuristic", "utility-cost",
		"--heuristic-opt", "price_per_worker_hour=10", "--heuristic-opt", "value_per_hour=20",
		"--heuristic-opt", "grow_by=1", "--heuristic-opt", "min_steps=15", "--heuristic-opt", "eval_every=5"}, 300, 2)
}

// A worker computing twice as slowly as the others (its process is slow,
// as a bad machine would be) is replaced: a new worker starts first, the
// straggler goes once it is in, and the world never has fewer than 3.
func TestAutoscaleReplacesStraggler(t *testing.T) {
	const steps = 250
	h, evs := runAutoscaled(t, e2e.Binary,
		[]string{"--np", "3", "--min-np", "3", "--max-np", "3", "--heuristic", "hold"},
		e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--compute", "1ms", "--model-size", "4096",
		"--straggler-worker", "1", "--straggler-factor", "2")
	e2e.LogDecisions(t, evs)
	h.Mu.Lock()
	defer h.Mu.Unlock()
	straggler := ""
	for _, l := range h.Lines {
		if l.Worker == 1 {
			straggler = l.WorkerName
		}
		if l.Size < 3 {
			t.Fatalf("step %d ran with %d workers: the world shrank", l.Step, l.Size)
		}
	}
	var decided, replaced *e2e.EngineEvent
	for i, ev := range evs {
		switch {
		case ev.Kind == heuristics.EventDecision && ev.Decision != nil && ev.Decision.Action == heuristics.Replace && decided == nil:
			decided = &evs[i]
		case ev.Kind == heuristics.EventDone && decided != nil && replaced == nil:
			replaced = &evs[i]
		}
	}
	if decided == nil || replaced == nil {
		t.Fatalf("no replacement carried out; launcher log:\n%s", h.Log.String())
	}
	if decided.Decision.Worker != straggler {
		t.Fatalf("replaced %s, but the straggler is %s", decided.Decision.Worker, straggler)
	}
	// Detection needs 3 warm-up and 10 sustained steps; reports arrive every
	// 10 steps or so.
	if decided.Step > 40 {
		t.Errorf("straggler found at step %d, want by step 40", decided.Step)
	}
	if s := evs[len(evs)-1].Summary; s.Replacements != 1 {
		t.Errorf("%d replacements, want 1 (the replacement is not slow)", s.Replacements)
	}
	// The members train on in the old world while they connect to the
	// replacement (sync.Config.JoinHold), so the straggler's last steps are
	// counted from the replacement's first step (the launcher numbered its
	// first 3 workers 0-2), not from the driver's event: once the
	// replacement trains, the straggler may finish the world that admitted
	// it and then goes.
	replacementIdx, replacementFirst := -1, int64(-1)
	for _, l := range h.Lines {
		if l.Worker >= 3 && (replacementFirst < 0 || l.Step < replacementFirst) {
			replacementIdx, replacementFirst = l.Worker, l.Step
		}
	}
	if replacementFirst < 0 {
		t.Fatalf("the replacement never trained a step; launcher log:\n%s", h.Log.String())
	}
	for _, l := range h.Lines {
		if l.Worker == 1 && l.Step > replacementFirst+5 {
			t.Fatalf("the straggler still trained at step %d, after its replacement (worker %d) trained step %d", l.Step, replacementIdx, replacementFirst)
		}
	}
	t.Logf("straggler detected at step %d (%.1f s), replaced by step %d (%.1f s); the replacement's first step %d", decided.Step, decided.Elapsed, replaced.Step, replaced.Elapsed, replacementFirst)
	e2e.CheckElasticInvariantsSteps(t, h.Lines, 4096, steps)
}

// The real example trainer runs under the scaling-efficiency heuristic: the
// engine measures it, grows it, decides visibly, and training still agrees and
// learns.
func TestFashionMNISTUnderScalingEfficiency(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	h, evs := runAutoscaled(t, e2e.Binary,
		[]string{"--np", "1", "--max-np", "3", "--heuristic", "scaling-efficiency",
			"--heuristic-opt", "min_steps=20", "--heuristic-opt", "eval_every=10"},
		// The whole training set: a run of a few seconds, so that the grown
		// workers join well before it ends even on a loaded machine (a
		// join took 0.8 s on an idle one).
		e2e.FashionMNIST, "--epochs", "2", "--json", "--log-every", "0")
	e2e.LogDecisions(t, evs)
	grew := false
	for _, ev := range evs {
		if ev.Kind == heuristics.EventDecision && strings.HasPrefix(ev.Message, "grow") {
			grew = true
		}
	}
	if !grew {
		t.Fatal("the engine never grew the job from one worker")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	checkFashionMNIST(t, h.Lines, 0.7)
}

// A policy in another program: the example exec plugin, selected through a
// configuration file as a member of a composition. It keeps a worker that
// adds at least 0.3 of a worker's throughput: by the known curve the 2nd
// adds 414 ≥ 0.3·653 = 196 samples/s, the 3rd 118 < 0.3·533 = 160, so it
// settles at 2. (At 0.5 the 2nd worker's margin was too thin for a loaded
// machine: CI measured it adding 285/s, under 0.5·645 = 322.)
func TestAutoscaleExecPluginFromConfigFile(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "heuristic.json")
	spec := fmt.Sprintf(`{"name": "any-of", "of": [
		{"name": "exec", "params": {"command": [%q, "--min-steps", "15", "--min-gain", "0.3"], "eval_every": 5, "timeout": "20s"}}]}`, e2e.HeuristicPlugin)
	if err := os.WriteFile(cfg, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	settlesOnKnownCurve(t, e2e.Binary, []string{"--np", "1", "--max-np", "4", "--heuristic-config", cfg}, 300, 2)
}

// A Go policy in a program of its own that runs gorovod's command line
// (examples/custom-launcher): `--heuristic marginal-gain` selects it like a
// built-in. It keeps a worker that adds at least 0.3 of a worker's
// throughput, so on the known curve, as the exec plugin above, it settles
// at 2.
func TestAutoscaleGoHeuristicInCustomLauncher(t *testing.T) {
	out, _, code := runWith(t, e2e.CustomLauncher, "run", "--list-heuristics")
	if code != 0 || !strings.Contains(out, "marginal-gain") || !strings.Contains(out, "scaling-efficiency") {
		t.Fatalf("exit %d, heuristics listed:\n%s", code, out)
	}
	settlesOnKnownCurve(t, e2e.CustomLauncher, []string{"--np", "1", "--max-np", "4", "--heuristic", "marginal-gain",
		"--heuristic-opt", "min_gain=0.3"}, 300, 2)
}
