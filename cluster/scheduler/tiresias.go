package scheduler

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// TiresiasConfig configures the Tiresias baseline.
type TiresiasConfig struct {
	// QueueThreshold is the GPU time (executed time × requested replicas)
	// after which a job drops from the high- to the low-priority queue;
	// 0 means 16 hours, as in Pollux's study.
	QueueThreshold time.Duration
}

// DefaultTiresiasConfig returns the configuration of Pollux's study.
func DefaultTiresiasConfig() TiresiasConfig {
	return TiresiasConfig{QueueThreshold: 16 * time.Hour}
}

// Tiresias is the two-queue discretized least-attained-service scheduler of
// Gu et al. (NSDI'19) as Pollux's study runs it: every job runs at the replica
// count its user asked for; jobs start in the first queue and drop to the
// second once they have used QueueThreshold of GPU time; each round, jobs are
// admitted queue by queue, first come first served within a queue, skipping
// those that do not fit; a job no longer admitted is preempted. A running job
// keeps its placement; a newly admitted one, or one running on fewer GPUs
// than it asked for, is packed onto the nodes with the most free GPUs. A job
// pinned to some nodes (Job.Eligible), or capped per node (Job.MaxPerNode),
// is admitted only where it fits on them, at most
// its cap on each, beside the jobs admitted before it; a job free to go
// anywhere moves off them for it (placeSized). Executed time is
// counted from the policy's own view of which jobs run, as Tiresias does.
type Tiresias struct {
	cfg       TiresiasConfig
	queues    [2][]string
	running   map[string]bool
	lastCheck map[string]int64 // seconds
	executed  map[string]int64 // seconds run since admission
}

// NewTiresias returns a Tiresias policy for one cluster.
func NewTiresias(cfg TiresiasConfig) *Tiresias {
	if cfg.QueueThreshold <= 0 {
		cfg.QueueThreshold = DefaultTiresiasConfig().QueueThreshold
	}
	return &Tiresias{cfg: cfg, running: map[string]bool{},
		lastCheck: map[string]int64{}, executed: map[string]int64{}}
}

// Name implements Policy.
func (t *Tiresias) Name() string { return "tiresias" }

// Allocate implements Policy; jobs must come in arrival order (new jobs join
// the first queue in that order).
func (t *Tiresias) Allocate(ctx context.Context, now time.Duration, jobs []Job, cluster Cluster, current Allocation) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cluster.validate(); err != nil {
		return nil, err
	}
	if err := validateJobs(jobs); err != nil {
		return nil, err
	}
	byID := make(map[string]*Job, len(jobs))
	for i := range jobs {
		if jobs[i].Replicas < 1 {
			return nil, fmt.Errorf("%w: %q asks for no replicas (Tiresias needs Replicas)", ErrInvalidJob, jobs[i].ID)
		}
		byID[jobs[i].ID] = &jobs[i]
	}
	// Forget finished jobs.
	for q := range t.queues {
		t.queues[q] = slices.DeleteFunc(t.queues[q], func(id string) bool { return byID[id] == nil })
	}
	for id := range t.running {
		if byID[id] == nil {
			delete(t.running, id)
			delete(t.lastCheck, id)
			delete(t.executed, id)
		}
	}
	alloc := make(Allocation, len(jobs))
	for id, nodes := range current {
		if byID[id] != nil {
			alloc[id] = slices.Clone(nodes)
		}
	}
	for _, j := range jobs {
		if _, known := t.running[j.ID]; !known {
			t.running[j.ID] = false
			t.queues[0] = append(t.queues[0], j.ID)
		}
	}
	// Account the time since the last round and demote.
	event := int64(now / time.Second)
	threshold := int64(t.cfg.QueueThreshold / time.Second)
	for _, j := range jobs {
		if t.running[j.ID] {
			t.executed[j.ID] += event - t.lastCheck[j.ID]
			if i := slices.Index(t.queues[0], j.ID); i >= 0 && t.executed[j.ID]*int64(j.Replicas) >= threshold {
				t.queues[0] = slices.Delete(t.queues[0], i, i+1)
				t.queues[1] = append(t.queues[1], j.ID)
			}
		}
		t.lastCheck[j.ID] = event
	}
	// Admit queue by queue. A running job keeps its nodes (its size as it
	// holds them); a job pinned to some nodes (Job.Eligible) or capped per
	// node (Job.MaxPerNode) is admitted only where those admitted before
	// it leave it room there.
	index := make(map[string]int, len(jobs))
	for i := range jobs {
		index[jobs[i].ID] = i
	}
	size := make([]int, len(jobs))
	var order []int
	for _, q := range t.queues {
		for _, id := range q {
			order = append(order, index[id])
		}
	}
	// A running job keeps its placement where it has its size. One
	// running on fewer (an elastic runtime shrank it to make room: the
	// scheduler service's repair) is placed anew at its size, so that it
	// grows back once there is room, instead of running small for good.
	keep := func(i int) []int {
		if nodes := alloc[jobs[i].ID]; len(nodes) == size[i] {
			return nodes
		}
		return nil
	}
	constrained := anyConstrained(jobs)
	gpus := cluster.TotalGPUs()
	for _, i := range order {
		id := jobs[i].ID
		size[i] = jobs[i].Replicas
		admit := jobs[i].Replicas <= gpus
		if admit && constrained {
			_, admit = placeSized(cluster, jobs, size, order, keep)
		}
		if admit {
			t.running[id] = true
			gpus -= jobs[i].Replicas
		} else {
			t.running[id] = false
			size[i] = 0
			delete(alloc, id)
		}
	}
	// Place the newly admitted.
	alloc, ok := placeSized(cluster, jobs, size, order, keep)
	if !ok {
		return nil, fmt.Errorf("scheduler: tiresias: the admitted jobs do not fit") // not reached: the last admitted fit
	}
	return alloc, nil
}
