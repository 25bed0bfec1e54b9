package stats

import (
	"math"
	"time"
)

// Step is one worker's timing of one committed step: what the driver's
// autoscaling engine measures the job by. Sessions record it at every Commit
// at the cost of two clock reads; sync.Config.OnStats receives them in batches.
type Step struct {
	Epoch   uint64 // the world epoch the step ran in
	Step    int64  // the committed step count after it
	Samples int    // as the trainer reported with RecordSamples (0: not reported)
	// Compute is the step's time not spent waiting for the other workers in
	// Allreduce, WaitAll or Commit.
	Compute time.Duration
	// StepTime runs from the end of the previous step (or of joining a world)
	// to the end of this one; the time to move to a new world is in neither.
	StepTime time.Duration
	// Loss is the trainer's mean loss per sample over this worker's share of
	// the step (Session.RecordLoss), when HasLoss says it reported one.
	Loss    float64
	HasLoss bool
	// Bytes is the size of the gradients this worker allreduced in the step.
	Bytes int64
	// Switch is, for the first step in a world, how long this worker took
	// to move to that world (connect its ring, receive the state); 0 for the
	// others.
	Switch time.Duration
	// Accum is how many micro-batches beyond the first the worker
	// accumulated into the step's gradient.
	Accum int
	// GradSqr and GradVar are the job's smoothed gradient statistics after
	// the step (goodput.GradParams); both 0 when not measured.
	GradSqr, GradVar float64
}

// Batch is a batch of a worker's step statistics.
type Batch struct {
	Steps []Step
	// TotalSteps is the trainer's planned length (Session.SetTotalSteps), 0
	// when unknown.
	TotalSteps int64
}

// Defaults of the statistics batching: a batch goes out once it holds
// DefaultEvery steps (or as configured) and minInterval has passed since the last, so a job
// with very short steps does not send a message per few milliseconds (each
// costs the worker about half a millisecond); a batch also ends when the
// world changes (it goes out with the next world's first step, see
// Commit), and never holds more than MaxBatch (which, at the widest
// numbers, loss, bytes and world switch included, still fits one 64 KiB
// membership message).
const (
	DefaultEvery = 10
	minInterval  = 250 * time.Millisecond
	MaxBatch     = 448
)

// Clock times the steps of a session and hands them out in batches.
type Clock struct {
	every     int
	onStats   func(Batch)
	total     int64
	start     time.Time     // the current step began
	waited    time.Duration // time blocked on the others in the current step
	samples   int
	lossSum   float64
	lossN     int
	bytes     int64
	switched  time.Duration // the move to the current world, for its first step
	grad      Step          // Accum, GradSqr and GradVar of the current step
	pending   []Step
	held      []Step // the last world's steps, handed out with the next commit
	lastFlush time.Time
}

// NewClock returns a clock that hands batches of about every steps (<= 0:
// DefaultEvery) to onBatch, on the goroutine calling Commit; onBatch must not
// block. With onBatch nil the clock records nothing.
func NewClock(every int, onBatch func(Batch)) Clock {
	if every <= 0 {
		every = DefaultEvery
	}
	return Clock{every: every, onStats: onBatch}
}

func (c *Clock) enabled() bool { return c.onStats != nil }

// AddSamples adds n to the samples of the current step.
func (c *Clock) AddSamples(n int) { c.samples += n }

// AddLoss records the trainer's mean loss per sample over its share of the
// current step; several calls in one step are averaged. A loss that is not
// finite is not recorded (the wire carries only numbers).
func (c *Clock) AddLoss(mean float64) {
	if math.IsNaN(mean) || math.IsInf(mean, 0) {
		return
	}
	c.lossSum += mean
	c.lossN++
}

// AddBytes adds n to the gradient bytes allreduced in the current step.
func (c *Clock) AddBytes(n int64) { c.bytes += n }

// SetTotal records the job's planned length in steps (0: unknown).
func (c *Clock) SetTotal(steps int64) { c.total = steps }

// Restart begins a fresh step (after joining or recovering a world): time
// spent moving between worlds is not a step's.
func (c *Clock) Restart(now time.Time) {
	c.start, c.waited, c.samples, c.lossSum, c.lossN, c.bytes, c.grad = now, 0, 0, 0, 0, 0, Step{}
}

// Entered begins the first step of a new world, which took this worker
// took to move to; the step's record carries it (Step.Switch).
func (c *Clock) Entered(now time.Time, took time.Duration) {
	c.Restart(now)
	c.switched = took
}

// Wait records time spent blocked on the other workers. It counts whether
// or not batches are handed out: Lap reports it to the gradient noise
// measurement's throughput profile.
func (c *Clock) Wait(since time.Time) { c.waited += time.Since(since) }

// Lap returns the current step's time so far and the part of it spent
// blocked on the other workers.
func (c *Clock) Lap(now time.Time) (elapsed, waited time.Duration) {
	return now.Sub(c.start), c.waited
}

// SetGrad records the current step's accumulation and gradient statistics
// (see Step).
func (c *Clock) SetGrad(accum int, sqr, variance float64) {
	c.grad.Accum, c.grad.GradSqr, c.grad.GradVar = accum, sqr, variance
}

// Commit records a committed step; worldChanging ends the batch there, so
// the engine hears a world's last steps without waiting for a full batch.
// That batch is handed out with the next commit (the next world's first
// step; HandHeld hands it out sooner), not at once: each batch is a message
// to the driver, and at the step boundary every member of the world sends
// one while the driver and the members are busy with the move.
func (c *Clock) Commit(epoch uint64, step int64, worldChanging bool) {
	now := time.Now()
	if !c.enabled() {
		c.Restart(now)
		return
	}
	c.HandHeld()
	elapsed := now.Sub(c.start)
	st := Step{Epoch: epoch, Step: step, Samples: c.samples, Compute: max(0, elapsed-c.waited), StepTime: elapsed,
		Bytes: c.bytes, Switch: c.switched, Accum: c.grad.Accum, GradSqr: c.grad.GradSqr, GradVar: c.grad.GradVar}
	if c.lossN > 0 {
		st.Loss, st.HasLoss = c.lossSum/float64(c.lossN), true
	}
	c.pending = append(c.pending, st)
	c.Restart(now)
	c.switched = 0
	switch {
	case worldChanging:
		c.held, c.pending = c.pending, make([]Step, 0, cap(c.pending))
	case len(c.pending) >= MaxBatch || (len(c.pending) >= c.every && now.Sub(c.lastFlush) >= minInterval):
		c.flush(now)
	}
}

// HandHeld hands out the batch that a world change ended (Commit), if any:
// a worker that leaves the job at that boundary sends it then.
func (c *Clock) HandHeld() {
	if len(c.held) == 0 {
		return
	}
	b := Batch{Steps: c.held, TotalSteps: c.total}
	c.held = nil
	c.onStats(b)
}

// Take removes and returns the steps not yet sent (a batch a world change
// ended included).
func (c *Clock) Take() (Batch, bool) {
	steps := append(c.held, c.pending...)
	c.held, c.pending = nil, nil
	if len(steps) == 0 {
		return Batch{}, false
	}
	return Batch{Steps: steps, TotalSteps: c.total}, true
}

func (c *Clock) flush(now time.Time) {
	if len(c.pending) == 0 {
		return
	}
	batch := Batch{Steps: c.pending, TotalSteps: c.total}
	c.pending = make([]Step, 0, cap(c.pending))
	c.lastFlush = now
	c.onStats(batch)
}
