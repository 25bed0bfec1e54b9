package simulator

import (
	"fmt"
	"math"

	"github.com/gorovod/gorovod/cluster/scheduler"
)

// rescaleModel is what a change of allocation costs a job, in seconds.
type rescaleModel struct {
	// start: a job that had no GPUs trains nothing for this long (process
	// start-up, restoring a checkpoint).
	start float64
	// rescale: a running job whose allocation changes trains nothing for
	// this long.
	rescale float64
	// joinerStartup, when positive, models a runtime that admits new
	// workers once they have started: a running job that gains GPUs first
	// trains on the GPUs it keeps for this long while its new workers start,
	// then pauses for rescale. Zero charges the whole change as one pause
	// (checkpoint-restart).
	joinerStartup float64
}

// phase is a stretch of a job's time after a reallocation: training on some
// of its GPUs, or (placement nil) a pause.
type phase struct {
	left      float64
	placement []int
}

// job is one simulated training job: a port of the original simulator's Job,
// which moves a job through its traces in simulated time.
type job struct {
	spec  WorkloadJob
	trace *Trace
	// Fixed configuration (baselines and fixed-batch models); 0 = adaptive.
	targetReplicas int
	targetBatch    int
	maxReplicas    int
	// minReplicas is the job's minimum (0: none); endCost the seconds from
	// its last step to its completion (Config.EndCost).
	minReplicas int
	endCost     float64

	model *agent // adaptive jobs only

	placement []int   // GPUs per node, in allocation order
	nodes     []int   // the allocation: node of each replica
	phases    []phase // what the last reallocation still costs
	active    []int   // the placement trained on now
	atomic    int     // per-GPU batch of the active placement
	accum     int     // its extra accumulation steps

	progress     float64
	epoch        int
	attained     float64 // GPU-seconds held
	restarts     int     // -1 until first allocated
	done         bool    // trained to the end
	completed    float64 // seconds: the last step's end plus endCost
	rescaleSpent float64 // seconds paused by reallocations
}

// epochs is the job's training length: it completes with the progress of
// this many epochs, its workload's when set, else its model's.
func (j *job) epochs() int {
	if j.spec.Epochs > 0 {
		return j.spec.Epochs
	}
	return j.trace.MaxEpochs
}

func sumInts(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// ceilEps is ceil(x − 1e-8): the original's rounding up that forgives
// floating-point noise.
func ceilEps(x float64) int { return int(math.Ceil(x - 1e-8)) }

// updateBatch sets the per-GPU batch and accumulation steps for training on
// placement: the job's fixed batch size split over its replicas, or, for an
// adaptive job, the goodput-optimal one (the smallest batch that gives every
// replica its minimum until something is measured).
func (j *job) updateBatch(placement []int) {
	t := j.trace
	reps := sumInts(placement)
	if reps == 0 {
		return
	}
	batch := j.targetBatch
	if batch == 0 && (j.model == nil || !j.model.ready()) {
		batch = max(t.InitBatchSize, t.MinLocalBatch*reps)
	}
	if batch == 0 {
		j.atomic, j.accum = j.model.optimize(len(placement), reps)
	} else {
		local := ceilEps(float64(batch) / float64(reps))
		j.accum = ceilEps(float64(local)/float64(t.MaxLocalBatch)) - 1
		if reps == 1 && batch > t.InitBatchSize {
			// One replica estimates the gradient noise from two
			// micro-batches.
			j.accum = max(1, j.accum)
		}
		j.atomic = ceilEps(float64(local) / float64(j.accum+1))
	}
	count := reps * (j.accum + 1)
	j.atomic = min(j.atomic, int(float64(t.MaxBatchSize)/float64(count)))
}

// kept is what of the old allocation the new one keeps, GPUs per node in the
// new allocation's order, and whether the new one adds GPUs anywhere.
func kept(oldNodes, newNodes []int) (placement []int, grows bool) {
	old := map[int]int{}
	for _, n := range oldNodes {
		old[n]++
	}
	next := map[int]int{}
	var order []int
	for _, n := range newNodes {
		if next[n] == 0 {
			order = append(order, n)
		}
		next[n]++
	}
	for _, n := range order {
		if k := min(old[n], next[n]); k > 0 {
			placement = append(placement, k)
		}
		grows = grows || next[n] > old[n]
	}
	return placement, grows
}

// reallocate moves the job to a new allocation (nil: none) and queues what
// the move costs it.
func (j *job) reallocate(nodes []int, m rescaleModel) {
	wasRunning := len(j.nodes) > 0
	oldNodes := j.nodes
	j.nodes = nodes
	j.phases = j.phases[:0]
	if len(nodes) == 0 {
		j.placement, j.active = nil, nil
		j.atomic = 0
		return
	}
	j.placement = scheduler.Placement(nodes)
	if j.restarts < 0 {
		j.restarts = 0
	} else {
		j.restarts++
	}
	switch keep, grows := kept(oldNodes, nodes); {
	case !wasRunning:
		j.phases = append(j.phases, phase{left: m.start})
	case m.joinerStartup > 0 && grows:
		j.phases = append(j.phases, phase{left: m.joinerStartup, placement: keep}, phase{left: m.rescale})
	default:
		j.phases = append(j.phases, phase{left: m.rescale})
	}
	j.activate()
}

// activate drops finished phases and sets the placement trained on now and
// its batch size.
func (j *job) activate() {
	for len(j.phases) > 0 && j.phases[0].left <= 0 {
		j.phases = j.phases[1:]
	}
	next := j.placement
	if len(j.phases) > 0 {
		next = j.phases[0].placement // nil: paused
	}
	j.active = next
	j.updateBatch(next)
}

// roundHalfEven is Python's round().
func roundHalfEven(x float64) float64 { return math.RoundToEven(x) }

// over says whether the job has completed by now: trained to the end and
// past its end cost. Until then it holds its GPUs.
func (j *job) over(now float64) bool { return j.done && j.completed <= now }

// mostReplicas is the most GPUs a job may run on in a cluster of slots: its
// cap (maxReplicas), or the size its user asked for (replicas) where the
// policy has no cap (Tiresias).
func mostReplicas(maxReplicas, replicas, slots int) int {
	switch {
	case maxReplicas > 0:
		return min(maxReplicas, slots)
	case replicas > 0:
		return min(replicas, slots)
	}
	return slots
}

// step advances the job by seconds of simulated time from now.
func (j *job) step(now, seconds float64) error {
	if len(j.placement) == 0 {
		return nil
	}
	held := float64(sumInts(j.placement))
	// Every piece of time is subtracted as the same float it was taken as,
	// so a phase or an interval ends at exactly zero (a residue would be
	// lost in `now` and never consumed).
	for seconds > 0 && !j.done {
		budget := seconds
		if len(j.phases) > 0 {
			budget = min(budget, j.phases[0].left)
		}
		used := budget
		if len(j.active) == 0 {
			j.rescaleSpent += budget // paused
		} else {
			left, err := j.train(now, budget)
			if err != nil {
				return err
			}
			used = budget - left
		}
		j.attained += used * held
		now += used
		seconds -= used
		if len(j.phases) > 0 {
			if j.phases[0].left -= used; j.phases[0].left <= 0 {
				j.activate()
			}
		}
	}
	if j.done {
		// Ending (Config.EndCost): it holds its GPUs until it completes.
		j.attained += min(seconds, max(j.completed-now, 0)) * held
	}
	return nil
}

// train runs the job on its active placement for seconds from now and
// returns the seconds left unused (0 unless the job completes).
func (j *job) train(now, seconds float64) (float64, error) {
	t := j.trace
	for seconds > 0 && !j.done {
		nodes, reps := len(j.active), sumInts(j.active)
		batch := float64(reps * j.atomic * (j.accum + 1))
		scale := batch / float64(t.InitBatchSize)
		stepTime, syncTime, err := t.StepTime(j.active, float64(j.atomic))
		if err != nil {
			return 0, fmt.Errorf("job %s: %w", j.spec.Name, err)
		}
		accumTime := stepTime - syncTime
		sqr, variance, err := t.GradStats(batch, j.epoch)
		if err != nil {
			return 0, fmt.Errorf("job %s: %w", j.spec.Name, err)
		}
		gain := 1.0
		if d := variance/scale + sqr; d > 0 {
			gain = (variance + sqr) / d
		}
		if j.model != nil {
			j.model.setGradStats(sqr, variance)
			if err := j.model.observe(nodes, reps, j.atomic, stepTime, syncTime); err != nil {
				return 0, fmt.Errorf("job %s: %w", j.spec.Name, err)
			}
		}
		goodput := gain / (stepTime + accumTime*float64(j.accum))
		next := t.Progress(j.epoch + 1)
		if j.progress+goodput*seconds < next {
			j.progress += goodput * seconds
			now += seconds
			seconds = 0
		} else {
			// The epoch ends within this interval (to the second, as
			// the original counts).
			j.epoch++
			delta := min(roundHalfEven((next-j.progress)/goodput), seconds)
			if j.epoch >= j.epochs() {
				j.done = true
				j.completed = now + delta + j.endCost
			}
			j.progress = next
			now += delta
			seconds -= delta
		}
		j.updateBatch(j.active)
	}
	return seconds, nil
}

// schedulerJob is what the policy sees of the job.
func (j *job) schedulerJob(now float64, gpusPerNode int) scheduler.Job {
	sj := scheduler.Job{
		ID:          j.spec.Name,
		Submitted:   secondsDuration(j.spec.Submitted.Seconds()),
		Attained:    secondsDuration(j.attained),
		Restarts:    max(j.restarts, 0),
		MinReplicas: j.minReplicas,
		MaxReplicas: j.maxReplicas,
		Replicas:    j.targetReplicas,
	}
	if j.model != nil {
		// A job with a minimum has run at it once it runs at all: Pollux
		// bounds a job by twice what it profiled, which must not fall
		// below its minimum (the scheduler service's rule).
		sj.MaxProfiledReplicas = max(j.model.maxProfiledReplicas(), j.minReplicas)
		if j.model.ready() {
			sj.Goodput = j.model.goodput()
		}
	}
	if j.targetBatch > 0 {
		sj.StepTime = func(replicas int) float64 { return j.oracleStepTime(replicas, gpusPerNode) }
		sj.RemainingSteps = j.remainingSteps()
	}
	return sj
}

// oracleStepTime is the true time per step of the job's fixed batch size on
// replicas GPUs packed onto as few nodes as possible (Optimus's oracle, with
// the original's accumulation rule).
func (j *job) oracleStepTime(replicas, gpusPerNode int) float64 {
	t := j.trace
	var placement []int
	for left := replicas; left > 0; left -= gpusPerNode {
		placement = append(placement, min(left, gpusPerNode))
	}
	local := ceilEps(float64(j.targetBatch) / float64(replicas))
	accum := ceilEps(float64(local)/float64(t.MaxLocalBatch)) - 1
	if replicas == 1 {
		accum = max(1, accum)
	}
	atomic := ceilEps(float64(local) / float64(accum+1))
	atomic = min(atomic, int(float64(t.MaxBatchSize)/float64(replicas*(accum+1))))
	step, sync, err := t.StepTime(placement, float64(atomic))
	if err != nil {
		return math.NaN()
	}
	return step + (step-sync)*float64(accum)
}

// remainingSteps is how many steps the job still runs at its fixed batch size.
func (j *job) remainingSteps() float64 {
	t := j.trace
	last := j.epochs() - 1
	if last <= j.epoch {
		return 1
	}
	a, errA := t.Iterations(float64(j.targetBatch), last)
	b, errB := t.Iterations(float64(j.targetBatch), j.epoch)
	if errA != nil || errB != nil {
		return 1
	}
	return a - b
}
