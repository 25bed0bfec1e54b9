package simulator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/gorovod/gorovod/cluster/scheduler"
)

// Policies the simulator runs.
const (
	Pollux   = "pollux"
	Optimus  = "optimus"
	Tiresias = "tiresias"
)

// Config configures a simulation. A zero field means its default.
type Config struct {
	// Policy is Pollux, Optimus or Tiresias (Pollux).
	Policy string
	// Nodes and GPUsPerNode shape the cluster (16 × 4).
	Nodes, GPUsPerNode int
	// Interval is the scheduling round (60 s).
	Interval time.Duration
	// RescaleCost is the time a running job trains nothing when its
	// allocation changes (30 s: AdaptDL's checkpoint-restart).
	// NoRescaleCost makes it 0.
	RescaleCost   time.Duration
	NoRescaleCost bool
	// StartCost is the time a job that had no GPUs trains nothing once it
	// gets some (its first start, or a resume after preemption); 0 means
	// the rescale cost, as in the paper.
	StartCost time.Duration
	// JoinerStartup, when positive, models a runtime that adds workers to a
	// running job without stopping it (gorovod): a job that gains GPUs
	// trains on the GPUs it keeps for this long while its new workers start,
	// then pauses for RescaleCost. 0 charges every change as one pause.
	JoinerStartup time.Duration
	// Pollux configures the Pollux policy. Its RestartPenalty defaults to
	// the rescale cost (and is 0 with NoRescaleCost).
	Pollux scheduler.PolluxConfig
	// Tiresias configures the Tiresias policy.
	Tiresias scheduler.TiresiasConfig
	// Models are the models the workload may name (LoadModels reads them
	// for a traces directory); nil means DefaultModels.
	Models map[string]ModelConfig
	// MaxTime stops a simulation that has not finished (30 days).
	MaxTime time.Duration
	// Elastic carries each round's allocation out as gorovod's scheduler
	// service does, for jobs that resize live and have no checkpoint to be
	// suspended into: a running job keeps at least its minimum
	// (WorkloadJob.MinReplicas, 1 when unset), a waiting one starts with at
	// least its minimum, waiting jobs are admitted in submission order by
	// shrinking running ones towards their minimums, and a job moved wholly
	// off its nodes keeps one of them (scheduler.RepairToMinimums,
	// AdmitByPriority, KeepOneCurrent, PlaceCounts). Every policy becomes
	// elastic so: Tiresias runs a job below its num_replicas rather than
	// queue another. False runs Pollux's study, where a job not given its
	// allocation is suspended.
	Elastic bool
	// EndCost is the time from a job's last step to its completion, during
	// which it holds its GPUs and trains nothing (its trainer's and
	// driver's exit, the job's status update); 0 in Pollux's study.
	EndCost time.Duration
}

// DefaultConfig returns the setup of Pollux's simulator study.
func DefaultConfig() Config {
	return Config{Policy: Pollux, Nodes: 16, GPUsPerNode: 4, Interval: time.Minute,
		RescaleCost: 30 * time.Second, Pollux: scheduler.DefaultPolluxConfig(),
		Tiresias: scheduler.DefaultTiresiasConfig(), Models: DefaultModels(), MaxTime: 30 * 24 * time.Hour}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Policy == "" {
		c.Policy = d.Policy
	}
	if c.Nodes <= 0 {
		c.Nodes = d.Nodes
	}
	if c.GPUsPerNode <= 0 {
		c.GPUsPerNode = d.GPUsPerNode
	}
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.RescaleCost <= 0 {
		c.RescaleCost = d.RescaleCost
	}
	if c.NoRescaleCost {
		c.RescaleCost = 0
	}
	if c.StartCost <= 0 {
		c.StartCost = c.RescaleCost
	}
	if c.Pollux.RestartPenalty == 0 && !c.Pollux.NoRestartPenalty {
		c.Pollux.RestartPenalty = c.RescaleCost
		c.Pollux.NoRestartPenalty = c.RescaleCost == 0
	}
	if c.Models == nil {
		c.Models = DefaultModels()
	}
	if c.MaxTime <= 0 {
		c.MaxTime = d.MaxTime
	}
	return c
}

// JobResult is one job's outcome.
type JobResult struct {
	Name  string `json:"name"`
	Model string `json:"model"`
	// Times in seconds since the workload began.
	Submitted float64 `json:"submitted_s"`
	Completed float64 `json:"completed_s"`
	JCT       float64 `json:"jct_s"`
	// Restarts counts the reallocations after the first allocation.
	Restarts int `json:"restarts"`
	// GPUSeconds is the GPU time the job held; RescaleSeconds the time it
	// spent paused by (re)allocations.
	GPUSeconds     float64 `json:"gpu_seconds"`
	RescaleSeconds float64 `json:"rescale_seconds"`
}

// Result is a simulation's outcome.
type Result struct {
	Policy string      `json:"policy"`
	Jobs   []JobResult `json:"jobs"`
	// Job completion times in seconds: mean, median, 99th percentile and
	// maximum.
	AvgJCT float64 `json:"avg_jct_s"`
	P50JCT float64 `json:"p50_jct_s"`
	P99JCT float64 `json:"p99_jct_s"`
	MaxJCT float64 `json:"max_jct_s"`
	// Makespan is when the last job completed, in seconds.
	Makespan float64 `json:"makespan_s"`
	// Utilization is the GPU time held by unfinished jobs over the cluster's
	// GPU time until the makespan.
	Utilization float64 `json:"gpu_utilization"`
	Rounds      int     `json:"rounds"`
}

func secondsDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Simulate replays a workload against the traces under the configured policy
// and returns every job's completion time.
func Simulate(ctx context.Context, cfg Config, workload []WorkloadJob, traces map[string]*Trace) (*Result, error) {
	cfg = cfg.withDefaults()
	if len(workload) == 0 {
		return nil, errors.New("simulator: empty workload")
	}
	var policy scheduler.Policy
	switch cfg.Policy {
	case Pollux:
		policy = scheduler.NewPollux(cfg.Pollux)
	case Optimus:
		policy = scheduler.NewOptimus()
	case Tiresias:
		policy = scheduler.NewTiresias(cfg.Tiresias)
	default:
		return nil, fmt.Errorf("simulator: unknown policy %q (want %s, %s or %s)", cfg.Policy, Pollux, Optimus, Tiresias)
	}
	cluster := scheduler.NewCluster(cfg.Nodes, cfg.GPUsPerNode)
	totalGPUs := cluster.TotalGPUs()
	jobs := make([]*job, len(workload))
	for i, w := range workload {
		t := traces[w.Model]
		mc, known := cfg.Models[w.Model]
		if t == nil || !known {
			return nil, fmt.Errorf("simulator: job %s: no traces for model %q", w.Name, w.Model)
		}
		if w.Epochs < 0 || w.Epochs > t.ValidatedEpochs {
			return nil, fmt.Errorf("simulator: job %s: %d epochs, but the validation traces of %s record %d",
				w.Name, w.Epochs, w.Model, t.ValidatedEpochs)
		}
		if w.MaxReplicas < 0 || w.MinReplicas < 0 {
			return nil, fmt.Errorf("simulator: job %s: replica bounds [%d, %d] include a negative one", w.Name, w.MinReplicas, w.MaxReplicas)
		}
		j := &job{spec: w, trace: t, restarts: -1, minReplicas: w.MinReplicas, endCost: max(cfg.EndCost.Seconds(), 0)}
		if cfg.Elastic {
			j.minReplicas = max(j.minReplicas, 1)
		}
		switch cfg.Policy {
		case Tiresias: // user-chosen size and batch ("TunedJobs")
			j.targetReplicas, j.targetBatch = w.Replicas, w.BatchSize
			if w.Replicas > totalGPUs {
				return nil, fmt.Errorf("simulator: job %s asks for %d GPUs; the cluster has %d", w.Name, w.Replicas, totalGPUs)
			}
		case Optimus: // user-chosen batch, policy-chosen size
			j.targetBatch = w.BatchSize
			j.maxReplicas = w.BatchSize / t.MinLocalBatch
		case Pollux: // adaptive batch and size
			j.targetBatch = mc.FixedBatch
			j.maxReplicas = min(totalGPUs, t.MaxBatchSize/t.MinLocalBatch)
			j.model = newAgent(t)
		}
		if cfg.Policy != Tiresias {
			for _, limit := range []int{mc.MaxReplicas, w.MaxReplicas} {
				if limit > 0 {
					j.maxReplicas = min(j.maxReplicas, limit)
				}
			}
		}
		if most := mostReplicas(j.maxReplicas, j.targetReplicas, totalGPUs); j.minReplicas > most {
			return nil, fmt.Errorf("simulator: job %s: minimum replicas %d above the most it may run, %d", w.Name, j.minReplicas, most)
		}
		if j.targetBatch > 0 && (j.targetBatch < t.InitBatchSize || j.targetBatch > t.MaxBatchSize) {
			return nil, fmt.Errorf("simulator: job %s: batch size %d outside the validated range [%d, %d] of %s",
				w.Name, j.targetBatch, t.InitBatchSize, t.MaxBatchSize, w.Model)
		}
		jobs[i] = j
	}

	// The policies and the elastic repair see jobs in the order they
	// arrived (the service's order among jobs of one priority).
	byArrival := slices.Clone(jobs)
	slices.SortStableFunc(byArrival, func(a, b *job) int { return cmp.Compare(a.spec.Submitted, b.spec.Submitted) })
	interval := cfg.Interval.Seconds()
	costs := rescaleModel{start: cfg.StartCost.Seconds(), rescale: cfg.RescaleCost.Seconds(),
		joinerStartup: max(cfg.JoinerStartup.Seconds(), 0)}
	alloc := scheduler.Allocation{}
	now := 0.0
	rounds := 0
	for {
		left := 0
		for _, j := range jobs {
			if !j.over(now) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if now >= cfg.MaxTime.Seconds() {
			return nil, fmt.Errorf("simulator: %d jobs unfinished after %v of simulated time", left, cfg.MaxTime)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, j := range jobs {
			if err := j.step(now, interval); err != nil {
				return nil, err
			}
		}
		now += interval
		rounds++
		var active []scheduler.Job
		current := scheduler.Allocation{}
		for _, j := range byArrival {
			if j.spec.Submitted.Seconds() <= now && !j.over(now) {
				active = append(active, j.schedulerJob(now, cfg.GPUsPerNode))
				if nodes, ok := alloc[j.spec.Name]; ok {
					current[j.spec.Name] = nodes
				}
			}
		}
		next := scheduler.Allocation{}
		if len(active) > 0 {
			var err error
			next, err = policy.Allocate(ctx, secondsDuration(now), active, cluster, current)
			if err != nil {
				return nil, fmt.Errorf("simulator: %s at %v: %w", policy.Name(), secondsDuration(now), err)
			}
			if err := checkAllocation(next, cluster, active); err != nil {
				return nil, fmt.Errorf("simulator: %s at %v: %w", policy.Name(), secondsDuration(now), err)
			}
			if cfg.Elastic {
				next = repairElastic(active, next, current, cluster)
				if err := checkAllocation(next, cluster, active); err != nil {
					return nil, fmt.Errorf("simulator: the elastic repair of %s at %v: %w", policy.Name(), secondsDuration(now), err)
				}
			}
		}
		for _, j := range jobs {
			if j.over(now) {
				if len(j.nodes) > 0 {
					j.reallocate(nil, costs)
				}
				continue
			}
			if nodes := next[j.spec.Name]; !slices.Equal(nodes, j.nodes) {
				j.reallocate(slices.Clone(nodes), costs)
			}
		}
		alloc = next
	}
	return summarize(policy.Name(), jobs, totalGPUs, rounds), nil
}

// repairElastic carries a policy's allocation (proposed) out as the scheduler
// service does (Config.Elastic); active is in priority order, each job with
// its minimum, cap and asked-for size as the policy saw them.
func repairElastic(active []scheduler.Job, proposed, current scheduler.Allocation, cluster scheduler.Cluster) scheduler.Allocation {
	slots := cluster.TotalGPUs()
	ids := make([]string, len(active))
	want := make([]int, len(active))
	floor := make([]int, len(active))
	running := make([]bool, len(active))
	for i, sj := range active {
		ids[i] = sj.ID
		floor[i] = sj.MinReplicas
		running[i] = len(current[sj.ID]) > 0
		want[i] = min(len(proposed[sj.ID]), mostReplicas(sj.MaxReplicas, sj.Replicas, slots))
	}
	counts := scheduler.RepairCounts(ids, want, floor, running, slots)
	proposed, order := scheduler.KeepOneCurrent(ids, counts, proposed, current)
	placed := scheduler.PlaceCounts(cluster, order, counts, proposed, current, nil, nil, nil)
	for i, id := range ids {
		if !running[i] && len(placed[id]) < floor[i] {
			delete(placed, id) // it waits for the next round
		}
	}
	return placed
}

// checkAllocation verifies a policy's answer: known jobs, nodes in range,
// no node over capacity, job bounds respected.
func checkAllocation(a scheduler.Allocation, c scheduler.Cluster, jobs []scheduler.Job) error {
	byID := make(map[string]*scheduler.Job, len(jobs))
	for i := range jobs {
		byID[jobs[i].ID] = &jobs[i]
	}
	used := make([]int, len(c.GPUs))
	for id, nodes := range a {
		j := byID[id]
		if j == nil {
			return fmt.Errorf("allocation for unknown job %q", id)
		}
		if j.MaxReplicas > 0 && len(nodes) > j.MaxReplicas {
			return fmt.Errorf("job %q got %d replicas, above its maximum %d", id, len(nodes), j.MaxReplicas)
		}
		for _, n := range nodes {
			if n < 0 || n >= len(c.GPUs) {
				return fmt.Errorf("job %q placed on node %d of %d", id, n, len(c.GPUs))
			}
			used[n]++
		}
	}
	for n, u := range used {
		if u > c.GPUs[n] {
			return fmt.Errorf("node %d given %d replicas for %d GPUs", n, u, c.GPUs[n])
		}
	}
	return nil
}

func summarize(policy string, jobs []*job, gpus, rounds int) *Result {
	r := &Result{Policy: policy, Rounds: rounds}
	jcts := make([]float64, 0, len(jobs))
	held := 0.0
	for _, j := range jobs {
		jr := JobResult{Name: j.spec.Name, Model: j.spec.Model,
			Submitted: j.spec.Submitted.Seconds(), Completed: j.completed,
			Restarts: max(j.restarts, 0), GPUSeconds: j.attained, RescaleSeconds: j.rescaleSpent}
		jr.JCT = jr.Completed - jr.Submitted
		r.Jobs = append(r.Jobs, jr)
		jcts = append(jcts, jr.JCT)
		r.AvgJCT += jr.JCT
		r.Makespan = max(r.Makespan, jr.Completed)
		held += j.attained
	}
	r.AvgJCT /= float64(len(jobs))
	sort.Float64s(jcts)
	r.P50JCT = percentile(jcts, 50)
	r.P99JCT = percentile(jcts, 99)
	r.MaxJCT = jcts[len(jcts)-1]
	if r.Makespan > 0 {
		r.Utilization = held / (float64(gpus) * r.Makespan)
	}
	return r
}

// percentile interpolates linearly between the closest ranks (numpy's
// default) in sorted values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (pos-float64(lo))*(sorted[hi]-sorted[lo])
}
