package simulator

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readTestWorkload(t *testing.T, load, name string) []WorkloadJob {
	t.Helper()
	w, err := ReadWorkloadFile(filepath.Join(polluxDir(t), load, name))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestBaselinesMatchTheArtifact replays workload 1 under the two baselines,
// which have no randomness: the original simulator's results (its published
// result files, and the same numbers when run here) are 2473.65 s for
// Tiresias and 4087.06 s for Optimus. Fed the original's interpolated step
// times, this simulator reproduces every job's completion time to the second;
// what remains is the triangulation the step times of unmeasured placements
// are interpolated on (docs/scheduler.md).
func TestBaselinesMatchTheArtifact(t *testing.T) {
	traces := loadTestTraces(t)
	w := readTestWorkload(t, "workloads", "workload-1.csv")
	for _, tc := range []struct {
		policy   string
		avg, tol float64
	}{
		{Tiresias, 2473.65, 0.001},
		{Optimus, 4087.0625, 0.02},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Policy = tc.policy
			res, err := Simulate(context.Background(), cfg, w, traces)
			if err != nil {
				t.Fatal(err)
			}
			if rel := math.Abs(res.AvgJCT/tc.avg - 1); rel > tc.tol {
				t.Fatalf("average JCT %.2f s, the artifact's %.2f s (%.2f%% off, tolerance %.1f%%)", res.AvgJCT, tc.avg, 100*rel, 100*tc.tol)
			}
			if len(res.Jobs) != 160 || res.Makespan <= 0 || res.Utilization <= 0 || res.Utilization > 1 {
				t.Fatalf("result %+v", res)
			}
		})
	}
}

// TestPolicyOrdering is the study in miniature: the first 30 jobs of
// workload 2 without the long ImageNet and YOLOv3 jobs, on 6 nodes, Pollux
// with a small genetic algorithm. Pollux finishes jobs sooner on average than
// Tiresias, which finishes them sooner than Optimus, as in the paper.
func TestPolicyOrdering(t *testing.T) {
	traces := loadTestTraces(t)
	var jobs []WorkloadJob
	for _, j := range readTestWorkload(t, "workloads", "workload-2.csv")[:30] {
		if j.Model != "imagenet" && j.Model != "yolov3" {
			jobs = append(jobs, j)
		}
	}
	avg := map[string]float64{}
	for _, p := range []string{Pollux, Tiresias, Optimus} {
		cfg := DefaultConfig()
		cfg.Policy, cfg.Nodes = p, 6
		cfg.Pollux.Population, cfg.Pollux.Generations = 20, 10
		res, err := Simulate(context.Background(), cfg, jobs, traces)
		if err != nil {
			t.Fatal(err)
		}
		avg[p] = res.AvgJCT
	}
	if !(avg[Pollux] < 0.9*avg[Tiresias] && avg[Tiresias] < avg[Optimus]) {
		t.Fatalf("average JCTs %v: want Pollux at least 10%% below Tiresias, Tiresias below Optimus", avg)
	}
}

func TestSimulateDeterministic(t *testing.T) {
	traces := loadTestTraces(t)
	var jobs []WorkloadJob
	for _, j := range readTestWorkload(t, "workloads", "workload-3.csv")[:15] {
		if j.Model == "cifar10" || j.Model == "ncf" {
			jobs = append(jobs, j)
		}
	}
	run := func(seed uint64) *Result {
		cfg := DefaultConfig()
		cfg.Nodes = 2
		cfg.Pollux.Population, cfg.Pollux.Generations, cfg.Pollux.Seed = 16, 8, seed
		res, err := Simulate(context.Background(), cfg, jobs, traces)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run(5), run(5)
	for i := range a.Jobs {
		if a.Jobs[i] != b.Jobs[i] {
			t.Fatalf("job %d: %+v, then %+v under the same seed", i, a.Jobs[i], b.Jobs[i])
		}
	}
}

func TestSimulateErrors(t *testing.T) {
	traces := loadTestTraces(t)
	job := WorkloadJob{Name: "a", Model: "cifar10", Replicas: 4, BatchSize: 512}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		cfg  func(*Config)
		jobs []WorkloadJob
		want string
	}{
		{"unknown policy", context.Background(), func(c *Config) { c.Policy = "fifo" }, []WorkloadJob{job}, "unknown policy"},
		{"unknown model", context.Background(), nil, []WorkloadJob{{Name: "a", Model: "gpt", Replicas: 1, BatchSize: 1}}, "no traces"},
		{"too big for Tiresias", context.Background(), func(c *Config) { c.Policy, c.Nodes = Tiresias, 1 }, []WorkloadJob{{Name: "a", Model: "cifar10", Replicas: 8, BatchSize: 512}}, "asks for 8 GPUs"},
		{"minimum above Tiresias's size", context.Background(), func(c *Config) { c.Policy, c.Elastic = Tiresias, true }, []WorkloadJob{{Name: "a", Model: "cifar10", Replicas: 2, BatchSize: 512, MinReplicas: 3}}, "minimum replicas 3 above the most it may run, 2"},
		{"minimum above the cluster", context.Background(), func(c *Config) { c.Nodes, c.GPUsPerNode = 1, 2 }, []WorkloadJob{{Name: "a", Model: "cifar10", Replicas: 2, BatchSize: 512, MinReplicas: 3}}, "minimum replicas 3 above the most it may run, 2"},
		{"batch outside the traces", context.Background(), func(c *Config) { c.Policy = Optimus }, []WorkloadJob{{Name: "a", Model: "cifar10", Replicas: 1, BatchSize: 64}}, "outside the validated range"},
		{"no time", context.Background(), func(c *Config) { c.Policy, c.MaxTime = Tiresias, time.Minute }, []WorkloadJob{job}, "unfinished"},
		{"empty", context.Background(), nil, nil, "empty workload"},
		{"canceled", canceled, func(c *Config) { c.Policy = Tiresias }, []WorkloadJob{job}, "canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			_, err := Simulate(tc.ctx, cfg, tc.jobs, traces)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestWorkloadEpochsAndMaxReplicas runs one job of the tiny model (40 s an
// epoch on one GPU at batch 8, two epochs by its ModelConfig, three
// validated) on a node of 2 GPUs, allocated at the first round (60 s) and
// starting for free.
func TestWorkloadEpochsAndMaxReplicas(t *testing.T) {
	traces := map[string]*Trace{"tiny": tinyTrace(t)}
	simulate := func(t *testing.T, policy string, job WorkloadJob) (*Result, error) {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Policy, cfg.Nodes, cfg.GPUsPerNode, cfg.NoRescaleCost = policy, 1, 2, true
		cfg.Pollux.Population, cfg.Pollux.Generations = 8, 4
		cfg.Models = map[string]ModelConfig{"tiny": {MaxEpochs: 2}}
		job.Name, job.Model = "j", "tiny"
		return Simulate(context.Background(), cfg, []WorkloadJob{job}, traces)
	}
	const firstRound = 60.0

	t.Run("epochs", func(t *testing.T) {
		completed := map[string][]float64{} // by policy, in the order 1, 0 (the model's 2), 3 epochs
		for _, tc := range []struct {
			policy    string
			epochs    int
			completed float64 // 0: only the ordering is checked
		}{
			{Tiresias, 1, firstRound + 40},
			{Tiresias, 0, firstRound + 80}, // the model's two
			{Tiresias, 3, firstRound + 120},
			{Optimus, 1, 0}, {Optimus, 0, 0}, {Optimus, 3, 0},
			{Pollux, 1, 0}, {Pollux, 0, 0}, {Pollux, 3, 0},
		} {
			t.Run(fmt.Sprintf("%s/%d", tc.policy, tc.epochs), func(t *testing.T) {
				res, err := simulate(t, tc.policy, WorkloadJob{Replicas: 1, BatchSize: 8, Epochs: tc.epochs})
				if err != nil {
					t.Fatal(err)
				}
				got := res.Jobs[0].Completed
				if tc.completed != 0 && got != tc.completed {
					t.Fatalf("completed at %v s, want %v s", got, tc.completed)
				}
				completed[tc.policy] = append(completed[tc.policy], got)
			})
		}
		// Fewer epochs than the model's finish earlier under every policy,
		// more finish later.
		for _, policy := range []string{Tiresias, Optimus, Pollux} {
			if c := completed[policy]; len(c) != 3 || !(c[0] < c[1] && c[1] < c[2]) {
				t.Errorf("%s: 1, 2 (the model's) and 3 epochs completed at %v s: want increasing", policy, c)
			}
		}
		if _, err := simulate(t, Tiresias, WorkloadJob{Replicas: 1, BatchSize: 8, Epochs: 4}); err == nil ||
			!strings.Contains(err.Error(), "job j: 4 epochs, but the validation traces of tiny record 3") {
			t.Fatalf("4 epochs of a model validated for 3: got %v", err)
		}
	})

	t.Run("max_replicas", func(t *testing.T) {
		for _, tc := range []struct {
			policy      string
			replicas    int
			maxReplicas int
			// The GPUs held on average from the first round on.
			minGPUs, maxGPUs float64
		}{
			{Optimus, 1, 0, 2, 2},
			{Optimus, 1, 1, 1, 1},
			{Pollux, 1, 0, 1.1, 2}, // one GPU until it has profiled it, then two
			{Pollux, 1, 1, 1, 1},
			{Tiresias, 2, 1, 2, 2}, // runs the replicas it asked for
		} {
			t.Run(fmt.Sprintf("%s/%d", tc.policy, tc.maxReplicas), func(t *testing.T) {
				res, err := simulate(t, tc.policy, WorkloadJob{Replicas: tc.replicas, BatchSize: 32, MaxReplicas: tc.maxReplicas})
				if err != nil {
					t.Fatal(err)
				}
				j := res.Jobs[0]
				if gpus := j.GPUSeconds / (j.Completed - firstRound); gpus < tc.minGPUs-1e-9 || gpus > tc.maxGPUs+1e-9 {
					t.Fatalf("held %v GPUs on average (%+v), want [%v, %v]", gpus, j, tc.minGPUs, tc.maxGPUs)
				}
			})
		}
	})
}

// TestElasticAndEndCost runs two jobs of the tiny model (80 steps of batch 8:
// 80 s on one GPU, 48 s on two) under Tiresias on one node of 2 GPUs, with
// rounds every 10 s and free starts: a arrives at 0 and b at 5, each asking
// for 2 GPUs. In Pollux's study b waits for a; elastic, b starts at its
// minimum beside a, which shrinks to its own, unless b's minimum does not
// fit beside a's.
func TestElasticAndEndCost(t *testing.T) {
	traces := map[string]*Trace{"tiny": tinyTrace(t)}
	for _, tc := range []struct {
		name        string
		elastic     bool
		endCost     time.Duration
		minB        int
		completed   [2]float64 // a, b
		restartsA   int
		gpuSecondsA float64
	}{
		// a runs on 2 GPUs from the round at 10 s to 58 s, freed at the
		// round at 60, where b starts: 60 + 48.
		{"suspended", false, 0, 0, [2]float64{58, 108}, 0, 96},
		// At 10 s neither runs, so a gets its 2 GPUs; at 20 s b starts
		// at its minimum and a shrinks to 1 GPU, with 80 − 10/0.6 steps
		// left (63 s, rounded to the second as the original does): a ends
		// at 83. b, on 1 GPU from 20 s, has 10 steps left at the round at
		// 90, where it grows back to its 2 GPUs: 6 s more.
		{"elastic", true, 0, 0, [2]float64{83, 96}, 1, 83},
		// b's minimum of 2 does not fit beside a's 1: b waits as above.
		{"elastic, b's minimum too big", true, 0, 2, [2]float64{58, 108}, 0, 96},
		// a ends at 58 + 5 s and holds its GPUs until then; b starts at
		// the round at 70.
		{"end cost", false, 5 * time.Second, 0, [2]float64{63, 123}, 0, 106},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Policy, cfg.Nodes, cfg.GPUsPerNode, cfg.NoRescaleCost = Tiresias, 1, 2, true
			cfg.Interval, cfg.Elastic, cfg.EndCost = 10*time.Second, tc.elastic, tc.endCost
			cfg.Models = map[string]ModelConfig{"tiny": {MaxEpochs: 2}}
			jobs := []WorkloadJob{
				{Name: "a", Model: "tiny", Replicas: 2, BatchSize: 8},
				{Name: "b", Submitted: 5 * time.Second, Model: "tiny", Replicas: 2, BatchSize: 8, MinReplicas: tc.minB},
			}
			res, err := Simulate(context.Background(), cfg, jobs, traces)
			if err != nil {
				t.Fatal(err)
			}
			a, b := res.Jobs[0], res.Jobs[1]
			if got := [2]float64{a.Completed, b.Completed}; got != tc.completed {
				t.Fatalf("completed at %v s, want %v s (%+v)", got, tc.completed, res.Jobs)
			}
			if a.Restarts != tc.restartsA || math.Abs(a.GPUSeconds-tc.gpuSecondsA) > 1e-9 {
				t.Fatalf("a: %d restarts holding %v GPU·s, want %d and %v", a.Restarts, a.GPUSeconds, tc.restartsA, tc.gpuSecondsA)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {50, 3}, {99, 4.96}, {100, 5}, {25, 2}} {
		if got := percentile(xs, tc.p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("percentile(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

// BenchmarkSimulatePollux is the whole of workload 1 (160 jobs, 16 × 4 GPUs)
// under Pollux with the paper's genetic algorithm: the "under 2 minutes"
// target. Run it with -benchtime 1x.
func BenchmarkSimulatePollux(b *testing.B) {
	traces := loadTestTraces(b)
	w, err := ReadWorkloadFile(filepath.Join(polluxDir(b), "workloads", "workload-1.csv"))
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		res, err := Simulate(context.Background(), DefaultConfig(), w, traces)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.AvgJCT, "avg-JCT-s")
	}
}
