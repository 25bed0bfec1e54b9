package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/simulator"
	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// traceSubject is one trainer of the workload measured on the test cluster
// (TestSchedulerWorkloadOnKubelets), as the cluster simulator's traces
// describe a model: its step times by worker count, and its progress and
// gradient statistics by data epoch at the batch size its jobs train at.
type traceSubject struct {
	app   string
	batch int // the global batch the workload's jobs train at (fixed)
	// epochs is the validation trace's length: the longest job's, in
	// this trace's data epochs.
	epochs int
	// timing is the trainer's command line for a run of about 12 s at
	// the given worker count and local batch; validation, for a run of
	// all epochs.
	timing     func(workers, local int) []string
	validation []string
	// metric is a data epoch's figure in the validation trace, from the
	// lines of the last world's rank 0 in that epoch.
	metric func(epoch []e2e.TrainerLine) (float64, bool)
}

// workloadSplits are the placements of 1 to 4 workers on the test
// cluster's two nodes of two slots each, as the traces name them (the GPU
// count on each node).
var workloadSplits = map[int][]string{1: {"1"}, 2: {"2", "11"}, 3: {"12"}, 4: {"22"}}

// traceSubjects are the synthetic trainer and the Fashion-MNIST example with
// the command lines of the workload's jobs (e2eEnv.submit). A synthetic
// data epoch is 1200 samples (jobs a and b; d and f train on 960, which
// changes no step's time: their length in these epochs is their samples
// over 1200).
func traceSubjects() []traceSubject {
	synthetic := func(steps, batch int) []string {
		return []string{e2e.Synthetic, "--json", "--samples", "1200", "--batch", strconv.Itoa(batch), "--model-size", "20000", "--compute", "2ms",
			"--steps", strconv.Itoa(steps)}
	}
	fashion := func(epochs, batch int) []string {
		return []string{e2e.FashionMNIST, "--json", "--log-every", "0", "--batch-size", strconv.Itoa(batch), "--epochs", strconv.Itoa(epochs)}
	}
	subjects := []traceSubject{{
		app: "synthetic", batch: 24, epochs: 60,
		// 2 ms a sample a worker: 12 s is 6000 samples a worker.
		timing:     func(workers, local int) []string { return synthetic(6000/local, local*workers) },
		validation: synthetic(60*50, 24),
		metric: func(epoch []e2e.TrainerLine) (float64, bool) { // the mean training loss
			var sum float64
			for _, l := range epoch {
				sum += l.Loss
			}
			return sum / float64(len(epoch)), len(epoch) > 0
		},
	}}
	if e2e.HaveFashionMNIST() {
		subjects = append(subjects, traceSubject{
			app: "fashion-mnist", batch: 64, epochs: 6,
			// ~3 s a data epoch at one worker here.
			timing:     func(workers, local int) []string { return fashion(4, local*workers) },
			validation: fashion(6, 64),
			metric: func(epoch []e2e.TrainerLine) (float64, bool) { // the test accuracy after it
				for _, l := range epoch {
					if l.Kind == "epoch" {
						return l.Accuracy, true
					}
				}
				return 0, false
			},
		})
	}
	return subjects
}

// TestRecordSimulatorTraces records the traces `gorovod simulate` replays
// the measured workload with (docs/scheduler.md, "A workload measured on the
// test cluster"), into $GOROVOD_RECORD_TRACES/<application>/: each trainer
// run by `gorovod run --json` (the build without -race) at 1 to 4 workers on
// this host, its median step time and the part not computing (waiting in
// the allreduce) from the launcher's progress records; then run to the end
// at 2 workers (the gradient noise needs two), with per data epoch the
// steps so far, a metric and the smoothed gradient statistics from the
// trainer's lines. The jobs train at a fixed batch, so progress (steps at
// the initial batch, scaled by statistical efficiency) is the step count.
// The test cluster's two nodes share one host (loopback), so each split of
// a worker count across them is given the one measurement of that count.
// Opt in:
//
//	GOROVOD_RECORD_TRACES=$PWD/../../bench/simtrace/traces go test -run TestRecordSimulatorTraces -v -timeout 30m ./cmd/gorovod
func TestRecordSimulatorTraces(t *testing.T) {
	dir := os.Getenv("GOROVOD_RECORD_TRACES")
	if dir == "" {
		t.Skip("records bench/simtrace's traces, a measurement of several minutes: set GOROVOD_RECORD_TRACES to the traces directory to write (CI replays the recorded traces in cli's TestSimulateRecordedWorkload)")
	}
	for _, s := range traceSubjects() {
		t.Run(s.app, func(t *testing.T) {
			out := filepath.Join(dir, s.app)
			if err := os.MkdirAll(out, 0o755); err != nil {
				t.Fatal(err)
			}
			var placements, scalability strings.Builder
			placements.WriteString("placement,local_bsz,step_time,sync_time\n")
			scalability.WriteString("num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
			for workers := 1; workers <= 4; workers++ {
				// Each worker count at the workload's batch and at the
				// smallest share of it (over 4 workers): Optimus's and
				// Pollux's jobs split a batch into smaller steps
				// (gradient accumulation, 2 at one GPU in Pollux's
				// rule), and the simulator is linear in the local
				// batch between the two.
				local := float64(s.batch) / float64(workers)
				smallest := s.batch / 4
				type measured struct{ step, sync float64 }
				at := map[int]measured{}
				for _, m := range []int{smallest, int(math.Round(local))} {
					if _, ok := at[m]; ok {
						continue
					}
					step, sync, n := measureStepTime(t, workers, s.timing(workers, m))
					t.Logf("%d workers at %d each: step %.2f ms, not computing %.2f ms (median of %d progress records)", workers, m, step*1e3, sync*1e3, n)
					at[m] = measured{step, sync}
				}
				// A global batch the workers cannot split evenly is
				// split into the two sizes around its share (64 over 3:
				// 22, 21, 21); the trace gives both the step's time.
				shares := []int{smallest, int(math.Floor(local)), int(math.Ceil(local))}
				slices.Sort(shares)
				for _, b := range slices.Compact(shares) {
					m, ok := at[b]
					if !ok {
						m = at[int(math.Round(local))]
					}
					for _, p := range workloadSplits[workers] {
						fmt.Fprintf(&placements, "%s,%d,%.6f,%.6f\n", p, b, m.step, m.sync)
						if len(p) > 1 {
							fmt.Fprintf(&scalability, "%d,%d,%d,%.6f,%.6f\n", len(p), workers, b, m.step, m.sync)
						}
					}
				}
			}
			validation, err := recordValidation(t, s)
			if err != nil {
				t.Fatal(err)
			}
			model, err := json.MarshalIndent(simulator.ModelConfig{MaxEpochs: s.epochs, FixedBatch: s.batch}, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			for name, body := range map[string]string{
				"placements.csv":                          placements.String(),
				"scalability.csv":                         scalability.String(),
				fmt.Sprintf("validation-%d.csv", s.batch): validation,
				"model.json":                              string(model) + "\n",
			} {
				if err := os.WriteFile(filepath.Join(out, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// What the simulator makes of it.
			models, err := simulator.LoadModels(dir, []string{s.app}, simulator.DefaultModels())
			if err != nil {
				t.Fatal(err)
			}
			tr, err := simulator.LoadTrace(out, s.app, models[s.app])
			if err != nil {
				t.Fatalf("the recorded trace does not load: %v", err)
			}
			for workers := 1; workers <= 4; workers++ {
				placement := []int{workers}
				if workers > 2 {
					placement = []int{2, workers - 2}
				}
				step, _, err := tr.StepTime(placement, float64(s.batch)/float64(workers))
				if err != nil {
					t.Errorf("%d workers: %v", workers, err)
				}
				t.Logf("%d workers: the simulator's step %.2f ms", workers, step*1e3)
			}
			// Optimus's oracle and Pollux run one GPU's batch as two
			// accumulated halves.
			if _, _, err := tr.StepTime([]int{1}, float64(s.batch)/2); err != nil {
				t.Errorf("one worker at half the batch: %v", err)
			}
		})
	}
}

// measureStepTime runs the trainer at workers workers and returns the
// median step time and the median part of it not computing, in seconds,
// over the launcher's progress records after the first (which holds the
// start), and how many records that was.
func measureStepTime(t *testing.T, workers int, trainer []string) (step, sync float64, records int) {
	t.Helper()
	h := e2e.StartRunJobArgvWithin(t, append([]string{e2e.PlainLauncher(t), "run", "--json", "--np", strconv.Itoa(workers), "--"}, trainer...), 5*time.Minute)
	if err := <-h.Exited; err != nil {
		t.Fatalf("gorovod run at %d workers: %v\n%s", workers, err, h.LogText())
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	var steps, computes []float64
	first := true
	for _, e := range h.Events {
		var p struct {
			Event     string  `json:"event"`
			Workers   int     `json:"workers"`
			StepMS    float64 `json:"step_ms"`
			ComputeMS float64 `json:"compute_ms"`
		}
		if json.Unmarshal([]byte(e), &p) != nil || p.Event != "progress" || p.Workers != workers || p.StepMS <= 0 {
			continue
		}
		if first {
			first = false
			continue
		}
		steps, computes = append(steps, p.StepMS), append(computes, p.ComputeMS)
	}
	if len(steps) < 3 {
		t.Fatalf("%d workers: %d progress records after the first, want at least 3", workers, len(steps))
	}
	step, compute := medianOf(steps)/1e3, medianOf(computes)/1e3
	return step, max(step-compute, 0), len(steps)
}

// recordValidation runs the trainer to the end at 2 workers and returns its
// validation trace: per data epoch, the steps so far (progress and
// iteration), the metric, and the gradient statistics after the epoch's
// last step.
func recordValidation(t *testing.T, s traceSubject) (string, error) {
	h := e2e.StartRunJobArgvWithin(t, append([]string{e2e.PlainLauncher(t), "run", "--json", "--np", "2", "--"}, s.validation...), 15*time.Minute)
	if err := <-h.Exited; err != nil {
		return "", fmt.Errorf("gorovod run: %v\n%s", err, h.LogText())
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	byEpoch := make([][]e2e.TrainerLine, s.epochs)
	for _, l := range h.Lines {
		if l.Rank != 0 || l.Epoch >= uint64(s.epochs) || (l.Kind != "" && l.Kind != "step" && l.Kind != "epoch") {
			continue
		}
		byEpoch[l.Epoch] = append(byEpoch[l.Epoch], l)
	}
	var b strings.Builder
	b.WriteString("progress,iteration,metric,grad_sqr,grad_var\n")
	for e, lines := range byEpoch {
		var last *e2e.TrainerLine
		for i := range lines {
			if l := &lines[i]; l.Kind != "epoch" && l.GradSqr != nil && (last == nil || l.Step > last.Step) {
				last = l
			}
		}
		metric, ok := s.metric(lines)
		if last == nil || !ok {
			return "", fmt.Errorf("data epoch %d: no step with gradient statistics, or no metric, among rank 0's %d lines", e, len(lines))
		}
		fmt.Fprintf(&b, "%d,%d,%.6g,%.6g,%.6g\n", last.Step, last.Step, metric, *last.GradSqr, *last.GradVar)
	}
	return b.String(), nil
}

// medianOf is the median of xs (not empty); xs is sorted in place.
func medianOf(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
