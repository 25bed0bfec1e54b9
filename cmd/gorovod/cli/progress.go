package cli

import (
	"slices"
	"sync"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/observe/report"
)

// progressEvery is how often `gorovod run` writes a progress record (--json,
// --report): often enough for a report's curves of a one-minute run.
const progressEvery = 2 * time.Second

// progressWindow gathers the workers' step statistics between two progress
// records and the time origin of the engine's events (its first world), so
// that the records share the events' time axis.
type progressWindow struct {
	mu      sync.Mutex
	origin  time.Time // the engine's first world; zero before it
	step    int64
	stepMS  []float64
	compMS  []float64
	lossSum float64 // weighted by samples when every report has them
	lossW   float64
}

// event takes what a progress record needs from a job event.
func (p *progressWindow) event(e job.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch e := e.(type) {
	case job.Autoscaling:
		if p.origin.IsZero() && !e.Time.IsZero() {
			p.origin = e.Time.Add(-time.Duration(e.Elapsed * float64(time.Second)))
		}
	case job.StepsReported:
		for _, r := range e.Steps {
			p.step = max(p.step, r.Step)
			p.stepMS = append(p.stepMS, float64(r.StepTime)/1e6)
			p.compMS = append(p.compMS, float64(r.Compute)/1e6)
			if r.HasLoss {
				w := 1.0
				if r.Samples > 0 {
					w = float64(r.Samples)
				}
				p.lossSum += r.Loss * w
				p.lossW += w
			}
		}
	}
}

// record makes the progress record of the window up to now, with the
// engine's view of the job, and starts the next window; ok is false before
// the first world.
func (p *progressWindow) record(now time.Time, st heuristics.Status) (report.Progress, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.origin.IsZero() {
		return report.Progress{}, false
	}
	r := report.Progress{Elapsed: now.Sub(p.origin).Seconds(), Step: max(p.step, st.Step), Workers: st.Workers,
		Epoch: st.Epoch, Throughput: st.Throughput, StepMS: median(p.stepMS), ComputeMS: median(p.compMS)}
	if st.Throughput > 0 {
		r.Unit = "steps/s"
		if st.Samples {
			r.Unit = "samples/s"
		}
	}
	if p.lossW > 0 {
		loss := p.lossSum / p.lossW
		r.Loss = &loss
	}
	p.stepMS, p.compMS, p.lossSum, p.lossW = p.stepMS[:0], p.compMS[:0], 0, 0
	return r, true
}

// median of xs (which it sorts); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}
