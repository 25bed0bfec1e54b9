package heuristics

import (
	"slices"
	"sort"
	"time"
)

// StepReport is one worker's account of one committed step, as the sync layer
// gathers it (sync/stats.Step, relayed to the driver every few steps).
type StepReport struct {
	Worker string // member name
	Epoch  uint64 // the world epoch the step ran in
	Step   int64  // the committed step count after this step
	// Samples this worker processed in the step; 0 when the trainer does not
	// say (throughput is then counted in steps).
	Samples int
	// Compute is the part of the step not spent waiting for the other
	// workers (in the gradient allreduce or the step boundary).
	Compute time.Duration
	// StepTime is the time from the previous step's end to this one's.
	StepTime time.Duration
	// TotalSteps is the trainer's planned step count, 0 when unknown.
	TotalSteps int64
	// Accum is how many micro-batches beyond the first the worker
	// accumulated into the step's gradient (0 without accumulation).
	Accum int
	// GradSqr and GradVar are the job's smoothed gradient statistics after
	// the step (goodput.GradParams, the same on every worker); GradVar is 0
	// when the trainer does not measure them.
	GradSqr, GradVar float64
	// Loss is the trainer's mean training loss per sample over the worker's
	// share of the step, when HasLoss (Session.RecordLoss); Bytes the
	// gradients it allreduced; Switch, for its first step in a world, how
	// long it took to move to that world. The engine does not use them:
	// they are for the run's progress records, metrics and report.
	Loss    float64
	HasLoss bool
	Bytes   int64
	Switch  time.Duration
}

// StepStats is one step of a world, once every member has reported it.
type StepStats struct {
	Step int64
	// GlobalBatch is the samples the world processed; 0 when not reported.
	GlobalBatch int
	// Time is the members' mean step time.
	Time time.Duration
	// Compute and Samples are per member.
	Compute map[string]time.Duration
	Samples map[string]int
	// Accum, GradSqr and GradVar as the members reported them (StepReport);
	// GradVar is 0 when not measured.
	Accum            int
	GradSqr, GradVar float64
}

// Period is the stretch of a job spent in one world epoch.
type Period struct {
	Epoch   uint64
	Members []string // in rank order
	Start   time.Time
	End     time.Time // zero while this is the current period
	// Skip is how many of the first steps of the period are not counted:
	// they include connecting the world and copying the state to joiners.
	Skip int
	// Steps holds the period's complete steps, in order: its newest ones,
	// and none once the period is old (the engine keeps a bounded number of
	// steps across the whole history, newest first; an old period keeps its
	// measurement).
	Steps []StepStats

	complete int          // steps completed in the period, kept or not
	dropped  bool         // Steps was given up: measured holds the measurement
	measured *Measurement // its measurement when its steps were given up
}

// Complete is the number of steps every member of the period completed,
// including those no longer in Steps.
func (p *Period) Complete() int { return max(p.complete, len(p.Steps)) }

// dropSteps gives up the period's steps, keeping their measurement; it
// returns how many it gave up.
func (p *Period) dropSteps() int {
	if p.dropped {
		return 0
	}
	m := p.Measure()
	n := len(p.Steps)
	p.complete = p.Complete()
	p.measured, p.dropped, p.Steps = &m, true, nil
	return n
}

// Workers is the period's world size.
func (p *Period) Workers() int { return len(p.Members) }

// Steady returns the steps measured after the first Skip.
func (p *Period) Steady() []StepStats {
	if len(p.Steps) <= p.Skip {
		return nil
	}
	return p.Steps[p.Skip:]
}

// Measurement summarizes a period's steady steps.
type Measurement struct {
	Workers int
	Epoch   uint64
	Steps   int // steady steps it is based on
	// Throughput is samples per second (steps per second when the trainer
	// does not report samples): the median global batch over the median step
	// time, so that the odd slow step (a garbage collection, a data-epoch
	// boundary, a busy machine) does not decide where the job settles.
	Throughput float64
	// StepTime is the median step time.
	StepTime time.Duration
	// GlobalBatch is the median global batch (0 when not reported).
	GlobalBatch int
}

// Unit names what Throughput counts: samples per second, or steps per second
// when the trainer reports no samples.
func (m Measurement) Unit() string {
	if m.GlobalBatch > 0 {
		return "samples/s"
	}
	return "steps/s"
}

// Measure summarizes the period's steady steps; Steps is 0 when there are none.
func (p *Period) Measure() Measurement {
	if p.dropped {
		return *p.measured
	}
	m := Measurement{Workers: p.Workers(), Epoch: p.Epoch}
	steady := p.Steady()
	if len(steady) == 0 {
		return m
	}
	times := make([]time.Duration, len(steady))
	batches := make([]int, len(steady))
	for i, s := range steady {
		times[i], batches[i] = s.Time, s.GlobalBatch
	}
	slices.Sort(times)
	sort.Ints(batches)
	m.Steps = len(steady)
	m.StepTime = times[len(times)/2]
	m.GlobalBatch = batches[len(batches)/2]
	work := float64(m.GlobalBatch)
	if work == 0 {
		work = 1 // steps per second
	}
	if m.StepTime > 0 {
		m.Throughput = work / m.StepTime.Seconds()
	}
	return m
}

// History is what the engine has measured of the job so far: the input of
// every heuristic.
type History struct {
	Start time.Time // when the job's first world formed
	Now   time.Time
	// Step is the newest step every member of its world has reported.
	Step int64
	// TotalSteps is the job's planned length in steps (from the trainer or
	// the configuration); 0 when unknown.
	TotalSteps int64
	// MinWorkers and MaxWorkers bound the world size (MaxWorkers 0: none).
	MinWorkers, MaxWorkers int
	// Periods, oldest first; the last is the current world.
	Periods []*Period
}

// Current is the period of the current world, nil before the first.
func (h *History) Current() *Period {
	if len(h.Periods) == 0 {
		return nil
	}
	return h.Periods[len(h.Periods)-1]
}

// Workers is the current world size (0 before the first world).
func (h *History) Workers() int {
	if c := h.Current(); c != nil {
		return c.Workers()
	}
	return 0
}

// Latest returns the newest measurement of a world of k workers with at
// least minSteps steady steps.
func (h *History) Latest(k, minSteps int) (Measurement, bool) {
	for i := len(h.Periods) - 1; i >= 0; i-- {
		p := h.Periods[i]
		if p.Workers() != k {
			continue
		}
		if m := p.Measure(); m.Steps >= max(1, minSteps) {
			return m, true
		}
	}
	return Measurement{}, false
}

// Remaining is the number of steps left, 0 when the length is unknown.
func (h *History) Remaining() int64 {
	if h.TotalSteps <= 0 {
		return 0
	}
	return max(0, h.TotalSteps-h.Step)
}

// Clamp bounds a target world size by MinWorkers and MaxWorkers.
func (h *History) Clamp(k int) int {
	if h.MaxWorkers > 0 {
		k = min(k, h.MaxWorkers)
	}
	return max(k, h.MinWorkers, 1)
}
