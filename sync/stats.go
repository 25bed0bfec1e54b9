package sync

import "time"

// StepStat is one worker's timing of one committed step: what the driver's
// autoscaling engine measures the job by. Sessions record it at every Commit
// at the cost of two clock reads; Config.OnStats receives them in batches.
type StepStat struct {
	Epoch   uint64 // the world epoch the step ran in
	Step    int64  // the committed step count after it
	Samples int    // as the trainer reported with RecordSamples (0: not reported)
	// Compute is the step's time not spent waiting for the other workers in
	// Allreduce, WaitAll or Commit.
	Compute time.Duration
	// StepTime runs from the end of the previous step (or of joining a world)
	// to the end of this one; the time to move to a new world is in neither.
	StepTime time.Duration
}

// StatsBatch is a batch of a worker's step statistics.
type StatsBatch struct {
	Steps []StepStat
	// TotalSteps is the trainer's planned length (Session.SetTotalSteps), 0
	// when unknown.
	TotalSteps int64
}

// Defaults of the statistics batching: a batch goes out once it holds
// statsEvery steps and statsMinInterval has passed since the last, so a job
// with very short steps does not send a message per few milliseconds (each
// costs the worker about half a millisecond); a batch also goes out when the
// world changes, and never holds more than statsMax (which, at the widest
// numbers, still fits one 64 KiB membership message).
const (
	DefaultStatsEvery = 10
	statsMinInterval  = 250 * time.Millisecond
	statsMax          = 640
)

// stepClock times the steps of a session.
type stepClock struct {
	every     int
	onStats   func(StatsBatch)
	total     int64
	start     time.Time     // the current step began
	waited    time.Duration // time blocked on the others in the current step
	samples   int
	pending   []StepStat
	lastFlush time.Time
}

func (c *stepClock) enabled() bool { return c.onStats != nil }

// restart begins a fresh step (after joining or recovering a world): time
// spent moving between worlds is not a step's.
func (c *stepClock) restart(now time.Time) {
	c.start, c.waited, c.samples = now, 0, 0
}

// wait records time spent blocked on the other workers.
func (c *stepClock) wait(since time.Time) {
	if c.enabled() {
		c.waited += time.Since(since)
	}
}

// commit records a committed step; worldChanging flushes the batch, so the
// engine hears a world's last steps without waiting for the next batch.
func (c *stepClock) commit(epoch uint64, step int64, worldChanging bool) {
	if !c.enabled() {
		return
	}
	now := time.Now()
	elapsed := now.Sub(c.start)
	c.pending = append(c.pending, StepStat{Epoch: epoch, Step: step, Samples: c.samples, Compute: max(0, elapsed-c.waited), StepTime: elapsed})
	c.restart(now)
	if worldChanging || len(c.pending) >= statsMax || (len(c.pending) >= c.every && now.Sub(c.lastFlush) >= statsMinInterval) {
		c.flush(now)
	}
}

// take removes and returns the steps not yet sent.
func (c *stepClock) take() (StatsBatch, bool) {
	if len(c.pending) == 0 {
		return StatsBatch{}, false
	}
	b := StatsBatch{Steps: c.pending, TotalSteps: c.total}
	c.pending = nil
	return b, true
}

func (c *stepClock) flush(now time.Time) {
	if len(c.pending) == 0 {
		return
	}
	batch := StatsBatch{Steps: c.pending, TotalSteps: c.total}
	c.pending = make([]StepStat, 0, cap(c.pending))
	c.lastFlush = now
	c.onStats(batch)
}
