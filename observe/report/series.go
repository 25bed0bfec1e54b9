package report

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/gorovod/gorovod/heuristics"
)

// Point is one value at a time (seconds since the first world).
type Point struct{ T, V float64 }

// Marker is one of the engine's events on the time axis.
type Marker struct {
	T     float64
	Kind  string // decision, done, failed, settled, straggler, error
	Label string // short: "grow +3", "settled at 4"
	Text  string // the event's message
}

// Segment is a value held over a stretch of time (a world's measurement).
type Segment struct{ T0, T1, V float64 }

// Series is what the plots draw, derived from a Run.
type Series struct {
	End     float64 // the last time the run is known at
	Workers []Point // a step function: the world size from each point on
	Markers []Marker
	// Throughput and StepMS come from progress records or trainer lines
	// (smoothed); Measured are the engine's measurements from the summary,
	// one segment for each world whose measurement the summary kept.
	Throughput, StepMS, Loss   []Point
	LossRaw                    []Point // per step, before smoothing
	MeasuredTP, MeasuredStepMS []Segment
	Unit                       string // of Throughput: samples/s or steps/s
	ThroughputFrom, LossFrom   string // where the curves come from, for captions
	StepsFromTrainer, Anchored bool
	TotalSteps                 int64
	WorkersAtTheEnd            int
}

// anchor is a known (time, step) pair.
type anchor struct {
	t    float64
	step int64
}

// smoothWindow is how many steps the rolling median spans.
const smoothWindow = 9

// Analyze derives the plotted series from a run.
func Analyze(run *Run) *Series {
	s := &Series{}
	anchors := run.anchors()
	for _, a := range anchors {
		s.End = max(s.End, a.t)
	}
	s.Anchored = len(anchors) >= 2

	// Workers over time: the world events, else the progress records.
	last := -1
	for _, ev := range run.Events {
		if ev.Kind == heuristics.EventWorld && ev.Workers != last {
			s.Workers = append(s.Workers, Point{ev.Elapsed, float64(ev.Workers)})
			last = ev.Workers
		}
	}
	if len(s.Workers) == 0 {
		for _, p := range run.Progress {
			if p.Workers > 0 && p.Workers != last {
				s.Workers = append(s.Workers, Point{p.Elapsed, float64(p.Workers)})
				last = p.Workers
			}
		}
	}
	if len(s.Workers) == 0 && run.Summary != nil {
		for _, sp := range run.Summary.Timeline {
			s.Workers = append(s.Workers, Point{sp.StartS, float64(sp.Workers)})
		}
	}
	if last >= 0 {
		s.WorkersAtTheEnd = last
	}

	for _, ev := range run.Events {
		if m, ok := marker(ev); ok {
			s.Markers = append(s.Markers, m)
		}
	}

	s.Unit = "steps/s"
	switch {
	case hasThroughput(run.Progress):
		s.ThroughputFrom = "the run's progress records"
		for _, p := range run.Progress {
			if p.Throughput > 0 {
				s.Throughput = append(s.Throughput, Point{p.Elapsed, p.Throughput})
				if p.Unit != "" {
					s.Unit = p.Unit
				}
			}
			if p.StepMS > 0 {
				s.StepMS = append(s.StepMS, Point{p.Elapsed, p.StepMS})
			}
		}
	case len(run.Steps) > 0 && s.Anchored:
		s.ThroughputFrom = fmt.Sprintf("the trainers' step lines (median of %d steps)", smoothWindow)
		s.StepsFromTrainer = true
		var tp, ms []Point
		for _, st := range run.Steps {
			if st.StepMS <= 0 {
				continue
			}
			t := timeOfStep(anchors, st.Step)
			ms = append(ms, Point{t, st.StepMS})
			if st.Global > 0 {
				s.Unit = "samples/s"
				tp = append(tp, Point{t, float64(st.Global) / st.StepMS * 1000})
			} else {
				tp = append(tp, Point{t, 1000 / st.StepMS})
			}
		}
		s.Throughput, s.StepMS = rollingMedian(tp, smoothWindow), rollingMedian(ms, smoothWindow)
	}

	switch {
	case hasLoss(run.Progress):
		s.LossFrom = "the run's progress records"
		for _, p := range run.Progress {
			if p.Loss != nil && finite(*p.Loss) {
				s.Loss = append(s.Loss, Point{p.Elapsed, *p.Loss})
			}
		}
	case s.Anchored:
		for _, st := range run.Steps {
			if finite(st.Loss) {
				s.LossRaw = append(s.LossRaw, Point{timeOfStep(anchors, st.Step), st.Loss})
			}
		}
		if len(s.LossRaw) > 0 {
			s.LossFrom = fmt.Sprintf("the trainers' step lines (mean over workers; line: median of %d steps)", smoothWindow)
			s.Loss = rollingMedian(s.LossRaw, smoothWindow)
		}
	}

	if sum := run.Summary; sum != nil {
		s.TotalSteps = sum.Steps
		// The summary keeps the newest measurement of each world size: it
		// belongs to the world of its epoch only (an earlier world of the
		// same size may have run at another speed, with a straggler say).
		byEpoch := map[uint64]heuristics.Measurement{}
		for _, m := range sum.Throughput {
			byEpoch[m.Epoch] = m
			if m.GlobalBatch > 0 {
				s.Unit = "samples/s"
			}
		}
		for _, sp := range sum.Timeline {
			m, ok := byEpoch[sp.Epoch]
			if !ok || sp.Steps == 0 {
				continue
			}
			s.MeasuredTP = append(s.MeasuredTP, Segment{sp.StartS, sp.StartS + sp.Duration, m.Throughput})
			s.MeasuredStepMS = append(s.MeasuredStepMS, Segment{sp.StartS, sp.StartS + sp.Duration, float64(m.StepTime) / float64(time.Millisecond)})
		}
		if s.ThroughputFrom == "" && len(s.MeasuredTP) > 0 {
			s.ThroughputFrom = "the summary's measurement of each world size (no per-step data in the output: run the trainer with --json)"
		}
	}
	// Values a plot cannot draw (a step of 1e-308 ms in a hand-made file)
	// are left out.
	for _, ps := range []*[]Point{&s.Workers, &s.Throughput, &s.StepMS, &s.Loss, &s.LossRaw} {
		*ps = slices.DeleteFunc(*ps, func(p Point) bool { return !finite(p.T) || !finite(p.V) })
	}
	for _, ss := range []*[]Segment{&s.MeasuredTP, &s.MeasuredStepMS} {
		*ss = slices.DeleteFunc(*ss, func(g Segment) bool { return !finite(g.T0) || !finite(g.T1) || !finite(g.V) })
	}
	s.Markers = slices.DeleteFunc(s.Markers, func(m Marker) bool { return !finite(m.T) })
	for _, ps := range [][]Point{s.Throughput, s.StepMS, s.Loss, s.Workers} {
		for _, p := range ps {
			s.End = max(s.End, p.T)
		}
	}
	if !finite(s.End) {
		s.End = 0
	}
	return s
}

// anchors are the run's known (time, step) pairs in time order, steps made
// non-decreasing.
func (run *Run) anchors() []anchor {
	var as []anchor
	for _, ev := range run.Events {
		as = append(as, anchor{ev.Elapsed, ev.Step})
	}
	for _, p := range run.Progress {
		as = append(as, anchor{p.Elapsed, p.Step})
	}
	if s := run.Summary; s != nil && finite(s.Elapsed) && s.Elapsed > 0 {
		as = append(as, anchor{s.Elapsed, s.Steps})
	}
	slices.SortStableFunc(as, func(a, b anchor) int { return cmp.Compare(a.t, b.t) })
	var top int64
	for i := range as {
		top = max(top, as[i].step)
		as[i].step = top
	}
	return as
}

// timeOfStep places a step on the time axis between the anchors around it:
// linearly between the last anchor at or below the step and the first above
// it, or at the rate of the last stretch beyond the last anchor.
func timeOfStep(as []anchor, step int64) float64 {
	i := sort.Search(len(as), func(i int) bool { return as[i].step > step })
	switch {
	case i == 0:
		return as[0].t
	case i < len(as):
		a, b := as[i-1], as[i]
		// i-1 is the last anchor at or below step; among anchors with the
		// same step, the latest (the world resumed from there).
		return a.t + (b.t-a.t)*float64(step-a.step)/float64(b.step-a.step)
	}
	last := as[len(as)-1]
	for j := len(as) - 2; j >= 0; j-- {
		if a := as[j]; a.step < last.step && a.t < last.t {
			rate := (last.t - a.t) / float64(last.step-a.step)
			return last.t + rate*float64(step-last.step)
		}
	}
	return last.t
}

// rollingMedian smooths a series with a centred median of w points; near
// the ends the window narrows to stay centred, so a trend (a falling loss)
// is not pulled towards its neighbours on one side.
func rollingMedian(ps []Point, w int) []Point {
	if len(ps) < 3 {
		return ps
	}
	out := make([]Point, len(ps))
	win := make([]float64, 0, w)
	for i := range ps {
		h := min(w/2, i, len(ps)-1-i)
		lo, hi := i-h, i+h+1
		win = win[:0]
		for _, p := range ps[lo:hi] {
			win = append(win, p.V)
		}
		sort.Float64s(win)
		out[i] = Point{ps[i].T, win[len(win)/2]}
	}
	return out
}

func hasThroughput(ps []Progress) bool {
	return slices.ContainsFunc(ps, func(p Progress) bool { return p.Throughput > 0 })
}

func hasLoss(ps []Progress) bool {
	return slices.ContainsFunc(ps, func(p Progress) bool { return p.Loss != nil && finite(*p.Loss) })
}

// marker turns an engine event worth marking into a marker.
func marker(ev heuristics.Event) (Marker, bool) {
	m := Marker{T: ev.Elapsed, Kind: ev.Kind, Text: ev.Message}
	switch ev.Kind {
	case heuristics.EventDecision:
		m.Label = "decision"
		if d := ev.Decision; d != nil {
			switch d.Action {
			case heuristics.Grow:
				m.Label = fmt.Sprintf("grow +%d", d.Count)
			case heuristics.Shrink:
				m.Label = fmt.Sprintf("shrink -%d", d.Count)
			case heuristics.Replace:
				m.Label = "replace"
			}
		}
	case heuristics.EventSettled:
		m.Label = fmt.Sprintf("settled at %d", ev.Workers)
	case heuristics.EventFailed:
		m.Label = "failed"
	case heuristics.EventStraggler:
		m.Label = "straggler"
	case heuristics.EventError:
		m.Label = "policy error"
	default: // world changes are the workers curve; "done" is where it moves
		return m, false
	}
	return m, true
}
