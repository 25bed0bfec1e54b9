package heuristics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// simStart is the simulated jobs' start: fixed, so that nothing depends on the clock.
var simStart = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

const simSkip = 2

func simMembers(k int) []string {
	m := make([]string, k)
	for i := range m {
		m[i] = fmt.Sprintf("w%d", i)
	}
	return m
}

// simPeriod is a world of k workers that ran simSkip transition steps and
// then steady steps of the same time and global batch, from firstStep on.
func simPeriod(epoch uint64, k, steady int, stepTime time.Duration, batch int, start time.Time, firstStep int64) *Period {
	p := &Period{Epoch: epoch, Members: simMembers(k), Start: start, Skip: simSkip}
	for i := range simSkip + steady {
		p.Steps = append(p.Steps, StepStats{Step: firstStep + int64(i) + 1, GlobalBatch: batch, Time: stepTime})
	}
	return p
}

// simHistory lays out periods one after another, each measured over steady
// steps, from simStart.
func simHistory(steady int, batch int, sizes []int, stepTime func(int) time.Duration) *History {
	h := &History{Start: simStart, Now: simStart}
	for i, k := range sizes {
		p := simPeriod(uint64(i+1), k, steady, stepTime(k), batch, h.Now, h.Step)
		h.Now = h.Now.Add(time.Duration(len(p.Steps)) * stepTime(k))
		h.Step += int64(len(p.Steps))
		if i < len(sizes)-1 {
			p.End = h.Now
		}
		h.Periods = append(h.Periods, p)
	}
	return h
}

// stepCurve returns step times of base/k + overhead·(k−1) seconds: compute split
// evenly, plus a communication cost growing with the world.
func stepCurve(base, overhead float64) func(int) time.Duration {
	return func(k int) time.Duration {
		return time.Duration(float64(time.Second) * (base/float64(k) + overhead*float64(k-1)))
	}
}

// simJob is an engine and a job in one: it runs steps at the curve's step
// time for the world size, asks the heuristic every `every` steps, and
// carries out its decisions as the engine does (clamped to the bounds).
type simJob struct {
	h        *History
	stepTime func(int) time.Duration
	batch    int
	every    int
	epoch    uint64

	sizes     []int      // the world size of each period
	decisions []Decision // every evaluation (decisions with numbers)
}

func newSimJob(k, minW, maxW int, stepTime func(int) time.Duration) *simJob {
	j := &simJob{h: &History{Start: simStart, Now: simStart, MinWorkers: minW, MaxWorkers: maxW}, stepTime: stepTime, batch: 64, every: 5}
	j.newWorld(k)
	return j
}

func (j *simJob) newWorld(k int) {
	if c := j.h.Current(); c != nil {
		c.End = j.h.Now
	}
	j.epoch++
	j.h.Periods = append(j.h.Periods, &Period{Epoch: j.epoch, Members: simMembers(k), Start: j.h.Now, Skip: simSkip})
	j.sizes = append(j.sizes, k)
}

func (j *simJob) runSteps(n int) {
	c := j.h.Current()
	t := j.stepTime(c.Workers())
	for range n {
		j.h.Step++
		j.h.Now = j.h.Now.Add(t)
		c.Steps = append(c.Steps, StepStats{Step: j.h.Step, GlobalBatch: j.batch, Time: t})
	}
}

// untilSettled runs the job until the heuristic holds, settled. apply, when
// not nil, may replace the world size a decision leads to (a failure, a
// clamp the engine applied) given the evaluation's index.
func (j *simJob) untilSettled(t *testing.T, heur Heuristic, apply func(i, k int, d Decision) int) Decision {
	t.Helper()
	for range 2000 {
		j.runSteps(j.every)
		d, err := heur.Decide(context.Background(), j.h)
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("invalid decision %v: %v", d, err)
		}
		if d.Numbers == nil { // measuring, or waiting for the next evaluation
			continue
		}
		j.decisions = append(j.decisions, d)
		k := j.h.Workers()
		next := k
		switch d.Action {
		case Grow:
			next = j.h.Clamp(k + d.Count)
		case Shrink:
			next = j.h.Clamp(k - d.Count)
		}
		if apply != nil {
			next = apply(len(j.decisions)-1, k, d)
		}
		if next != k {
			j.newWorld(next)
		}
		if d.Settled && d.Action == Hold {
			return d
		}
	}
	t.Fatalf("not settled after 2000 calls; sizes %v; last decision %v", j.sizes, j.decisions[len(j.decisions)-1])
	return Decision{}
}

func (j *simJob) trace() string {
	var b strings.Builder
	for _, d := range j.decisions {
		fmt.Fprintf(&b, "\n  %v", d)
	}
	return b.String()
}

func TestSearchMeasuresFirst(t *testing.T) {
	heur, err := NewRegistry().New(Spec{Name: "scaling-efficiency"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := heur.Decide(ctx, &History{})
	if err != nil || d.Action != Hold {
		t.Fatalf("empty history: %v, %v; want a hold", d, err)
	}
	h := simHistory(7, 64, []int{4}, stepCurve(1, 0.02))
	d, _ = heur.Decide(ctx, h)
	if d.Action != Hold || d.Reason != "measuring 4 workers: 7/20 steps" {
		t.Fatalf("7 steady steps: %v; want hold measuring 4 workers: 7/20 steps", d)
	}
}

// An unchanged world is judged again only eval_every steps later; a settled
// search says so even while waiting.
func TestSearchEvalEvery(t *testing.T) {
	heur, err := NewRegistry().New(Spec{Name: "scaling-efficiency", Params: []byte(`{"eval_every": 10, "min_steps": 20}`)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// 5→6: s = 0.25 > 0.1 per TestScalingEfficiencySearch; with max 6 the
	// search settles at once.
	h := simHistory(20, 64, []int{5, 6}, stepCurve(1, 0.02))
	h.MaxWorkers = 6
	d, _ := heur.Decide(ctx, h)
	if d.Action != Hold || !d.Settled || d.Numbers["efficiency"] == 0 {
		t.Fatalf("first evaluation: %v; want a settled hold with the efficiency", d)
	}
	h.Step += 9
	d, _ = heur.Decide(ctx, h)
	if d.Action != Hold || !d.Settled || d.Numbers != nil || !strings.Contains(d.Reason, "next evaluation at step") {
		t.Fatalf("9 steps later: %v; want a settled hold waiting for the next evaluation", d)
	}
	h.Step++
	d, _ = heur.Decide(ctx, h)
	if d.Action != Hold || !d.Settled || d.Numbers == nil {
		t.Fatalf("10 steps later: %v; want a settled hold, evaluated", d)
	}
}

// Periods too short to judge are passed over when looking for the previous
// size.
func TestSearchSkipsShortPeriods(t *testing.T) {
	heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
	h := simHistory(20, 64, []int{1, 5, 9}, stepCurve(1, 0.02))
	// A 9-worker world that lasted 3 steps between 1 and 5 changes nothing.
	short := simPeriod(99, 9, 3, stepCurve(1, 0.02)(9), 64, h.Now, h.Step)
	h.Periods = []*Period{h.Periods[0], short, h.Periods[1]}
	d, _ := heur.Decide(context.Background(), h)
	if d.Action != Grow || d.Count != 4 || d.Numbers["workers_old"] != 1 || d.Numbers["workers_new"] != 5 {
		t.Fatalf("got %v %v; want grow by 4 judged on 1→5", d, d.Numbers)
	}
}

func TestSearchConfigErrors(t *testing.T) {
	for _, params := range []string{
		`{"grow_by": 0}`,
		`{"min_steps": 0}`,
		`{"eval_every": -1}`,
		`{"grow_by": "4"}`,
	} {
		for _, name := range []string{"scaling-efficiency", "utility-cost"} {
			p := params
			if name == "utility-cost" {
				p = strings.Replace(p, "{", `{"price_per_worker_hour": 1, "value_per_hour": 1, `, 1)
			}
			if _, err := NewRegistry().New(Spec{Name: name, Params: []byte(p)}); err == nil {
				t.Errorf("%s %s: no error", name, p)
			}
		}
	}
}
