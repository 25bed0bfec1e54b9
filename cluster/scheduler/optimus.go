package scheduler

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"
)

// Optimus is the greedy scheduler of Peng et al. (EuroSys'18) as Pollux's
// study runs it ("Optimus+Oracle"): every job gets one GPU while GPUs last
// (in arrival order), then GPUs go one at a time to the job whose remaining
// time falls most from one more replica — (StepTime(r) − StepTime(r+1)) ×
// RemainingSteps, with the true step times — until none is left or no job
// gains. Jobs keep their placement while their size is unchanged; the others
// are packed onto the nodes with the most free GPUs, smallest jobs first.
// A job pinned to some nodes (Job.Eligible) gets replicas only there, one
// capped per node (Job.MaxPerNode) at most its cap on each, and only as many
// as fit beside those given before it (placeSized places such jobs first).
// It keeps no state between rounds.
type Optimus struct{}

// NewOptimus returns the Optimus policy.
func NewOptimus() *Optimus { return &Optimus{} }

// Name implements Policy.
func (*Optimus) Name() string { return "optimus" }

// Allocate implements Policy; jobs should come in arrival order (ties in
// marginal gain go to the earlier job).
func (*Optimus) Allocate(ctx context.Context, now time.Duration, jobs []Job, cluster Cluster, current Allocation) (Allocation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cluster.validate(); err != nil {
		return nil, err
	}
	if err := validateJobs(jobs); err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return Allocation{}, nil
	}
	for _, j := range jobs {
		if j.StepTime == nil {
			return nil, fmt.Errorf("%w: %q has no StepTime (Optimus needs it)", ErrInvalidJob, j.ID)
		}
	}
	gpus := cluster.TotalGPUs()
	replicas := make([]int, len(jobs))
	gain := make([]float64, len(jobs))
	marginal := func(i int) (float64, error) {
		j := &jobs[i]
		if (j.MaxReplicas > 0 && replicas[i]+1 > j.MaxReplicas) || gpus < 1 {
			return 0, nil
		}
		a, b := j.StepTime(replicas[i]), j.StepTime(replicas[i]+1)
		if math.IsNaN(a) || math.IsNaN(b) {
			return 0, fmt.Errorf("scheduler: optimus: %q has no step time at %d or %d replicas", j.ID, replicas[i], replicas[i]+1)
		}
		return (a - b) * j.RemainingSteps, nil
	}
	// Every job starts at its minimum (at least one replica), smallest
	// minimum first, then in arrival order.
	first := make([]int, len(jobs))
	for i := range first {
		first[i] = i
	}
	sort.SliceStable(first, func(a, b int) bool {
		return max(jobs[first[a]].MinReplicas, 1) < max(jobs[first[b]].MinReplicas, 1)
	})
	// Placement: keep unchanged sizes where they are, pack the rest,
	// smallest jobs first (then in arrival order).
	place := func() (Allocation, bool) {
		order := make([]int, len(jobs))
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(a, b int) bool { return replicas[order[a]] < replicas[order[b]] })
		return placeSized(cluster, jobs, replicas, order, func(i int) []int {
			if nodes := current[jobs[i].ID]; len(nodes) == replicas[i] {
				return nodes
			}
			return nil
		})
	}
	// A job pinned to some nodes (Job.Eligible) or capped per node
	// (Job.MaxPerNode) takes a replica only where the replicas given so
	// far, its own included, can still be placed.
	constrained := anyConstrained(jobs)
	fits := func() bool {
		if !constrained {
			return true // counts within the cluster always fit
		}
		_, ok := place()
		return ok
	}
	var err error
	for _, i := range first {
		start := max(jobs[i].MinReplicas, 1)
		if start > gpus {
			continue
		}
		if replicas[i] = start; !fits() {
			replicas[i] = 0
			continue
		}
		gpus -= start
		if gain[i], err = marginal(i); err != nil {
			return nil, err
		}
	}
	for gpus > 0 {
		best := first[0]
		for _, i := range first {
			if gain[i] > gain[best] {
				best = i
			}
		}
		if !(gain[best] > 0) {
			break
		}
		if replicas[best]++; !fits() {
			replicas[best]--
			gain[best] = 0 // its nodes are full
			continue
		}
		if gain[best], err = marginal(best); err != nil {
			return nil, err
		}
		gpus--
	}
	alloc, ok := place()
	if !ok {
		return nil, fmt.Errorf("scheduler: optimus: the replicas %v do not fit", replicas) // not reached: fits held each
	}
	return alloc, nil
}
