package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Cluster is the pool a policy allocates: the GPU count of each node. A job
// replica uses one GPU.
type Cluster struct {
	GPUs []int
}

// NewCluster returns a cluster of nodes identical nodes.
func NewCluster(nodes, gpusPerNode int) Cluster {
	c := Cluster{GPUs: make([]int, nodes)}
	for i := range c.GPUs {
		c.GPUs[i] = gpusPerNode
	}
	return c
}

// TotalGPUs is the number of GPUs in the cluster.
func (c Cluster) TotalGPUs() int {
	n := 0
	for _, g := range c.GPUs {
		n += g
	}
	return n
}

func (c Cluster) validate() error {
	if len(c.GPUs) == 0 {
		return errors.New("scheduler: the cluster has no nodes")
	}
	for i, g := range c.GPUs {
		if g < 0 || g > 255 {
			return fmt.Errorf("scheduler: node %d has %d GPUs (want 0 to 255)", i, g)
		}
	}
	return nil
}

// Allocation gives each job the node index of each of its replicas (a job
// with no replicas is absent). The order of the list is the order the job's
// replicas are placed in, which the baselines keep stable while a job runs.
type Allocation map[string][]int

// Clone returns a deep copy.
func (a Allocation) Clone() Allocation {
	out := make(Allocation, len(a))
	for k, v := range a {
		out[k] = slices.Clone(v)
	}
	return out
}

// Placement returns the GPU count of each node a replica list uses, node by
// node in the order the list visits them (consecutive replicas on one node
// form one entry).
func Placement(replicas []int) []int {
	var out []int
	for i, n := range replicas {
		if i == 0 || n != replicas[i-1] {
			out = append(out, 1)
		} else {
			out[len(out)-1]++
		}
	}
	return out
}

// Job is what a policy knows of one active (submitted, unfinished) job.
// Which fields matter depends on the policy: Pollux reads Goodput, Tiresias
// Replicas, Optimus StepTime and RemainingSteps; all read the rest.
type Job struct {
	ID string
	// Submitted is when the job arrived, on the clock Allocate's now is on.
	Submitted time.Duration
	// Attained is the GPU time the job has held so far (replicas × time).
	Attained time.Duration
	// Restarts counts the job's reallocations after its first allocation.
	Restarts int
	// MinReplicas and MaxReplicas bound the job's size; a job is either
	// given at least MinReplicas or nothing. MaxReplicas 0 means no bound
	// beyond the cluster.
	MinReplicas, MaxReplicas int
	// Eligible, when not nil, says which nodes (by index) the job's
	// replicas may use; a node beyond its end is not eligible. nil: every
	// node. Every policy allocates only eligible nodes to the job, and no
	// more replicas than they hold; where two jobs' sets overlap, the job
	// the policy ranks first keeps its claim (Tiresias: queue order;
	// Optimus: its start order, smallest minimum, then arrival).
	Eligible []bool
	// Preference, when not nil, scores the nodes (by index) for the job's
	// replicas: where a policy's choice of node is open, the job's replicas
	// go to the eligible nodes of highest score first (a node beyond its
	// end scores 0). It is a placement choice only: it makes no node
	// eligible or ineligible and changes no job's replica count. Pollux
	// takes, of the allocations of equal fitness it finds, the one whose
	// replicas score most; Tiresias and Optimus, and PlaceCounts, pack a
	// job on its nodes of highest score, then most free GPUs. A running
	// job is not moved for it.
	Preference []int
	// MaxPerNode, when above 0, is the most replicas of the job one node
	// may hold (spreading a job's replicas over nodes, for their network
	// bandwidth or to survive a node's loss); 0: no limit beyond the
	// node's GPUs. Every policy, and PlaceCounts, keeps to it: a job gets
	// no more replicas than its eligible nodes hold at that many each,
	// and one whose minimum does not fit so gets nothing.
	MaxPerNode int

	// Goodput is the job's predicted goodput (useful training progress per
	// second, in any unit consistent across calls) on replicas GPUs spread
	// over nodes nodes, at the batch size best for that allocation; nil
	// while nothing has been measured, in which case Pollux assumes perfect
	// scaling. Pollux only compares a job's goodputs with each other.
	Goodput func(nodes, replicas int) float64
	// MaxProfiledReplicas is the largest replica count the job has been
	// measured at: Pollux lets a job grow to at most twice that, since its
	// goodput model is an extrapolation beyond it.
	MaxProfiledReplicas int

	// Replicas is the replica count the job's user asked for (Tiresias
	// runs every job at exactly this size).
	Replicas int

	// StepTime is the job's time per step at a replica count (Optimus
	// assumes it knows it: "oracle" throughput), and RemainingSteps how
	// many steps it still has to run.
	StepTime       func(replicas int) float64
	RemainingSteps float64
}

// Policy chooses an allocation of the cluster to the active jobs.
type Policy interface {
	// Name names the policy ("pollux", "tiresias", "optimus").
	Name() string
	// Allocate is called once per scheduling round with the time now,
	// every active job, the cluster and the allocation in force. A policy
	// may keep state between rounds (Tiresias its queues, Pollux its
	// population), so one value schedules one cluster. The returned
	// allocation fits the cluster; current is not modified.
	Allocate(ctx context.Context, now time.Duration, jobs []Job, cluster Cluster, current Allocation) (Allocation, error)
}

// ErrInvalidJob reports a job a policy cannot schedule.
var ErrInvalidJob = errors.New("scheduler: invalid job")

func validateJobs(jobs []Job) error {
	seen := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		switch {
		case j.ID == "":
			return fmt.Errorf("%w: empty ID", ErrInvalidJob)
		case seen[j.ID]:
			return fmt.Errorf("%w: %q appears twice", ErrInvalidJob, j.ID)
		case j.MinReplicas < 0 || j.MaxReplicas < 0 || (j.MaxReplicas > 0 && j.MinReplicas > j.MaxReplicas):
			return fmt.Errorf("%w: %q has replica bounds [%d, %d]", ErrInvalidJob, j.ID, j.MinReplicas, j.MaxReplicas)
		case j.Attained < 0 || j.Restarts < 0 || j.MaxProfiledReplicas < 0 || j.Replicas < 0 || j.RemainingSteps < 0 || j.MaxPerNode < 0:
			return fmt.Errorf("%w: %q has a negative count", ErrInvalidJob, j.ID)
		case slices.ContainsFunc(j.Preference, func(score int) bool { return score < 0 }):
			return fmt.Errorf("%w: %q has a negative node preference", ErrInvalidJob, j.ID)
		}
		seen[j.ID] = true
	}
	return nil
}

// eligibleNode says whether node n is in a job's eligible set (nil: all).
func eligibleNode(eligible []bool, n int) bool {
	return eligible == nil || (n >= 0 && n < len(eligible) && eligible[n])
}

// preferenceOf is node n's score in a job's preference (nil: 0 for all).
func preferenceOf(preference []int, n int) int {
	if n >= 0 && n < len(preference) {
		return preference[n]
	}
	return 0
}

// nodeRoom is how many more of a job's replicas node n may take: its free
// GPUs, at most maxPerNode (0: no limit) less the have[n] replicas the job
// already has there (have nil: none), and none where the node is not
// eligible.
func nodeRoom(free []int, n int, eligible []bool, maxPerNode int, have []int) int {
	if !eligibleNode(eligible, n) {
		return 0
	}
	room := free[n]
	if maxPerNode > 0 {
		held := 0
		if have != nil {
			held = have[n]
		}
		room = min(room, maxPerNode-held)
	}
	return max(room, 0)
}

// mostFreeNode returns, among the nodes with room for one more of the job's
// replicas (nodeRoom), the one of highest preference score (nil: all score
// 0), then the most free GPUs, then the lowest index; -1 when none has room.
func mostFreeNode(free []int, eligible []bool, preference []int, maxPerNode int, have []int) int {
	best := -1
	for n, f := range free {
		if nodeRoom(free, n, eligible, maxPerNode, have) < 1 {
			continue
		}
		if best < 0 {
			best = n
			continue
		}
		if p, q := preferenceOf(preference, n), preferenceOf(preference, best); p > q || (p == q && f > free[best]) {
			best = n
		}
	}
	return best
}

// packReplicas places count replicas of job on the nodes with room for them
// (nodeRoom: eligible, and at most job.MaxPerNode each) of highest
// preference score, then with the most free GPUs (mostFreeNode), filling
// one node before moving to the next (how both baselines place a job), and
// takes them from free. It returns nil, taking nothing, if they do not fit.
func packReplicas(free []int, count int, job *Job) []int {
	total := 0
	for n := range free {
		total += nodeRoom(free, n, job.Eligible, job.MaxPerNode, nil)
	}
	if count > total {
		return nil
	}
	out := make([]int, 0, count)
	var have []int
	if job.MaxPerNode > 0 {
		have = make([]int, len(free))
	}
	for len(out) < count {
		n := mostFreeNode(free, job.Eligible, job.Preference, job.MaxPerNode, have)
		take := min(nodeRoom(free, n, job.Eligible, job.MaxPerNode, have), count-len(out))
		for i := 0; i < take; i++ {
			out = append(out, n)
		}
		free[n] -= take
		if have != nil {
			have[n] += take
		}
	}
	return out
}

// placeSized places jobs[i]'s size[i] replicas (none where 0) as both
// baselines do, and says whether all fit. A job keeps the nodes keep(i)
// gives (nil: none), taken as its replicas, where they are eligible and
// free; the others are packed (packReplicas), in the order given. Jobs with
// an eligible set (Job.Eligible) go first: those kept, then the others,
// each packed on its own nodes; then the jobs free to go anywhere, so that
// such a job moves off the only nodes a pinned one may use rather than keep
// it waiting. A job with a cap per node (Job.MaxPerNode) counts as pinned
// here, since it too needs room on several nodes; a kept placement over its
// cap is not kept.
func placeSized(cluster Cluster, jobs []Job, size, order []int, keep func(i int) []int) (Allocation, bool) {
	free := slices.Clone(cluster.GPUs)
	alloc := make(Allocation, len(jobs))
	kept := func(i int) bool {
		nodes := keep(i)
		if len(nodes) == 0 {
			return false
		}
		if !withinCap(nodes, jobs[i].MaxPerNode) {
			return false
		}
		for k, n := range nodes {
			if n < 0 || n >= len(free) || !eligibleNode(jobs[i].Eligible, n) || free[n] < 1 {
				for _, m := range nodes[:k] {
					free[m]++
				}
				return false
			}
			free[n]--
		}
		alloc[jobs[i].ID] = slices.Clone(nodes)
		return true
	}
	for _, pinned := range []bool{true, false} {
		mine := func(i int) bool { return size[i] > 0 && constrained(&jobs[i]) == pinned }
		for _, i := range order {
			if mine(i) {
				kept(i)
			}
		}
		for _, i := range order {
			if !mine(i) || alloc[jobs[i].ID] != nil {
				continue
			}
			nodes := packReplicas(free, size[i], &jobs[i])
			if nodes == nil {
				return alloc, false
			}
			alloc[jobs[i].ID] = nodes
		}
	}
	return alloc, true
}

// constrained says whether a job may not use every GPU of the cluster: it
// has an eligible set or a cap per node.
func constrained(j *Job) bool { return j.Eligible != nil || j.MaxPerNode > 0 }

// anyConstrained says whether some job is constrained: then counts that fit
// the cluster's GPUs may not fit its nodes.
func anyConstrained(jobs []Job) bool {
	return slices.ContainsFunc(jobs, func(j Job) bool { return constrained(&j) })
}

// withinCap says whether a replica list puts at most maxPerNode (0: any
// number) replicas on each node.
func withinCap(nodes []int, maxPerNode int) bool {
	if maxPerNode <= 0 {
		return true
	}
	count := map[int]int{}
	for _, n := range nodes {
		if count[n]++; count[n] > maxPerNode {
			return false
		}
	}
	return true
}

// CapacityFor is the most replicas a job may hold on a cluster: each
// eligible node's GPUs (eligible nil: every node), at most maxPerNode each
// (0: no cap).
func CapacityFor(cluster Cluster, eligible []bool, maxPerNode int) int {
	room := 0
	for n := range cluster.GPUs {
		room += nodeRoom(cluster.GPUs, n, eligible, maxPerNode, nil)
	}
	return room
}

// freeGPUs returns each node's GPUs not used by the jobs of alloc; replicas
// on nodes outside the cluster are ignored.
func freeGPUs(cluster Cluster, alloc Allocation) []int {
	free := slices.Clone(cluster.GPUs)
	for _, nodes := range alloc {
		for _, n := range nodes {
			if n >= 0 && n < len(free) {
				free[n]--
			}
		}
	}
	return free
}
