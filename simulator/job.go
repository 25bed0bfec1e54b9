package simulator

import (
	"fmt"
	"math"

	"github.com/gorovod/gorovod/scheduler"
)

// agent is what an adaptive (Pollux) job learns about itself while it runs:
// a throughput model fitted to the step times it has seen and the gradient
// statistics of its last step, from which it predicts its goodput and picks
// its batch size.
type agent interface {
	// observe records a step measured at a configuration; the model refits
	// when the configuration is new.
	observe(nodes, replicas, atomicBatch int, stepTime, syncTime float64) error
	// setGradStats records the gradient statistics of the last step.
	setGradStats(sqr, variance float64)
	// ready reports whether anything has been measured.
	ready() bool
	// goodput predicts the goodput (progress per second) with the best batch
	// size for the allocation.
	goodput(nodes, replicas int) float64
	// optimize picks the batch size for the allocation: per-GPU batch and
	// extra accumulation steps.
	optimize(nodes, replicas int) (atomicBatch, accumSteps int)
	// maxProfiledReplicas is the largest replica count measured.
	maxProfiledReplicas() int
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

	model agent // adaptive jobs only

	placement    []int // GPUs per node, in allocation order
	nodes        []int // the allocation: node of each replica
	atomic       int   // per-GPU batch
	accum        int   // extra accumulation steps
	rescaleLeft  float64
	progress     float64
	epoch        int
	attained     float64 // GPU-seconds held
	restarts     int     // -1 until first allocated
	done         bool
	completed    float64 // seconds
	rescaleSpent float64 // seconds spent rescaling
}

func (j *job) replicas() int {
	n := 0
	for _, g := range j.placement {
		n += g
	}
	return n
}

// ceilEps is ceil(x − 1e-8): the original's rounding up that forgives
// floating-point noise.
func ceilEps(x float64) int { return int(math.Ceil(x - 1e-8)) }

// updateBatch sets the per-GPU batch and accumulation steps for the current
// placement: the job's fixed batch size split over its replicas, or, for an
// adaptive job, the goodput-optimal one (the smallest batch that gives every
// replica its minimum until something is measured).
func (j *job) updateBatch() {
	t := j.trace
	reps := j.replicas()
	if reps == 0 {
		return
	}
	batch := j.targetBatch
	if batch == 0 && (j.model == nil || !j.model.ready()) {
		batch = max(t.InitBatchSize, t.MinLocalBatch*reps)
	}
	if batch == 0 {
		j.atomic, j.accum = j.model.optimize(len(j.placement), reps)
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

// reallocate moves the job to a new allocation (nil: none), which costs it
// rescale seconds before it trains again.
func (j *job) reallocate(nodes []int, rescale float64) {
	j.nodes = nodes
	if len(nodes) == 0 {
		j.placement = nil
		j.atomic = 0
		return
	}
	j.placement = scheduler.Placement(nodes)
	j.updateBatch()
	j.rescaleLeft = rescale
	if j.restarts < 0 {
		j.restarts = 0
	} else {
		j.restarts++
	}
}

// roundHalfEven is Python's round().
func roundHalfEven(x float64) float64 { return math.RoundToEven(x) }

// step advances the job by seconds of simulated time from now.
func (j *job) step(now, seconds float64) error {
	if len(j.placement) == 0 || j.done {
		return nil
	}
	reps := float64(j.replicas())
	delay := min(j.rescaleLeft, seconds)
	now += delay
	j.attained += delay * reps
	j.rescaleSpent += delay
	j.rescaleLeft -= delay
	seconds -= delay
	t := j.trace
	for seconds > 0 && !j.done {
		nodes := len(j.placement)
		batch := float64(j.replicas() * j.atomic * (j.accum + 1))
		scale := batch / float64(t.InitBatchSize)
		stepTime, syncTime, err := t.StepTime(j.placement, float64(j.atomic))
		if err != nil {
			return fmt.Errorf("job %s: %w", j.spec.Name, err)
		}
		accumTime := stepTime - syncTime
		sqr, variance, err := t.GradStats(batch, j.epoch)
		if err != nil {
			return fmt.Errorf("job %s: %w", j.spec.Name, err)
		}
		gain := 1.0
		if d := variance/scale + sqr; d > 0 {
			gain = (variance + sqr) / d
		}
		if j.model != nil {
			j.model.setGradStats(sqr, variance)
			if err := j.model.observe(nodes, j.replicas(), j.atomic, stepTime, syncTime); err != nil {
				return fmt.Errorf("job %s: %w", j.spec.Name, err)
			}
		}
		goodput := gain / (stepTime + accumTime*float64(j.accum))
		next := t.Progress(j.epoch + 1)
		if j.progress+goodput*seconds < next {
			j.progress += goodput * seconds
			j.attained += seconds * reps
			seconds = 0
		} else {
			// The epoch ends within this interval (to the second, as
			// the original counts).
			j.epoch++
			delta := min(roundHalfEven((next-j.progress)/goodput), seconds)
			if j.epoch >= t.MaxEpochs {
				j.done = true
				j.completed = now + delta
			}
			j.progress = next
			now += delta
			j.attained += delta * reps
			seconds -= delta
		}
		j.updateBatch()
	}
	return nil
}

// schedulerJob is what the policy sees of the job.
func (j *job) schedulerJob(now float64, gpusPerNode int) scheduler.Job {
	sj := scheduler.Job{
		ID:          j.spec.Name,
		Submitted:   secondsDuration(j.spec.Submitted.Seconds()),
		Attained:    secondsDuration(j.attained),
		Restarts:    max(j.restarts, 0),
		MaxReplicas: j.maxReplicas,
		Replicas:    j.targetReplicas,
	}
	if j.model != nil {
		sj.MaxProfiledReplicas = j.model.maxProfiledReplicas()
		if j.model.ready() {
			sj.Goodput = j.model.goodput
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
	last := t.MaxEpochs - 1
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
