package heuristics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gorovod/gorovod/heuristics"
)

// targetThroughput grows the job one worker at a time until it trains at
// least Target samples per second, then holds there.
type targetThroughput struct {
	Target   float64 `json:"target"`    // samples per second
	MinSteps int     `json:"min_steps"` // steady steps a measurement needs
}

func (*targetThroughput) Name() string { return "target-throughput" }

func (p *targetThroughput) Decide(_ context.Context, h *heuristics.History) (heuristics.Decision, error) {
	k := h.Workers()
	m, ok := h.Latest(k, p.MinSteps)
	if !ok {
		return heuristics.HoldBecause("measuring %d workers", k), nil
	}
	if m.Throughput >= p.Target {
		d := heuristics.HoldBecause("%d workers train %.0f %s, at least %.0f", k, m.Throughput, m.Unit(), p.Target)
		d.Settled = true
		return d, nil
	}
	return heuristics.Decision{Action: heuristics.Grow, Count: 1,
		Reason:  fmt.Sprintf("%d workers train %.0f %s, below %.0f", k, m.Throughput, m.Unit(), p.Target),
		Numbers: map[string]float64{"throughput": m.Throughput, "target": p.Target}}, nil
}

// A custom heuristic: implement Heuristic, register a factory for it in a
// Registry, and select it by name (gorovod's command line with that registry,
// cli.Config.Heuristics, offers it as `--heuristic target-throughput`; a job
// run from Go takes it in job.Config.Autoscaling.Heuristic).
func Example_customHeuristic() {
	r := heuristics.NewRegistry()
	err := r.Register("target-throughput", "grow until the job trains target samples/s",
		func(_ *heuristics.Registry, s heuristics.Spec) (heuristics.Heuristic, error) {
			p := &targetThroughput{MinSteps: 10}
			if err := heuristics.DecodeParams(s.Params, p); err != nil {
				return nil, err
			}
			if p.Target <= 0 {
				return nil, fmt.Errorf("target must be positive, got %v", p.Target)
			}
			return p, nil
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	spec, err := heuristics.SpecFromOptions("target-throughput", []string{"target=1000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	h, err := r.New(spec)
	if err != nil {
		fmt.Println(err)
		return
	}

	// What the engine would have measured: a world of 2 workers, each step
	// a global batch of 64 samples in 80 ms (800 samples/s), then a world
	// of 3 at 50 ms a step (1280 samples/s).
	world := func(epoch uint64, members []string, step time.Duration) *heuristics.Period {
		p := &heuristics.Period{Epoch: epoch, Members: members}
		for i := range 12 {
			p.Steps = append(p.Steps, heuristics.StepStats{Step: int64(i + 1), GlobalBatch: 64, Time: step})
		}
		return p
	}
	hist := &heuristics.History{MinWorkers: 1, MaxWorkers: 4,
		Periods: []*heuristics.Period{world(1, []string{"a", "b"}, 80*time.Millisecond)}}
	d, _ := h.Decide(context.Background(), hist)
	fmt.Println(d)
	hist.Periods = append(hist.Periods, world(2, []string{"a", "b", "c"}, 50*time.Millisecond))
	d, _ = h.Decide(context.Background(), hist)
	fmt.Println(d, "| settled:", d.Settled)
	// Output:
	// grow by 1: 2 workers train 800 samples/s, below 1000
	// hold: 3 workers train 1280 samples/s, at least 1000 | settled: true
}
