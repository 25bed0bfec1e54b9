package main

import (
	"context"
	"fmt"
	"os"

	"github.com/gorovod/gorovod/cmd/gorovod/cli"
	"github.com/gorovod/gorovod/heuristics"
)

func main() {
	r := heuristics.NewRegistry()
	if err := r.Register("marginal-gain", "keep each worker that adds at least min_gain (0.5) of a worker's throughput", newMarginalGain); err != nil {
		fmt.Fprintln(os.Stderr, "custom-launcher:", err)
		os.Exit(1)
	}
	os.Exit(cli.Run(cli.Config{Heuristics: r}))
}

// marginalGain is the policy; its parameters come from --heuristic-opt or a
// configuration file's "params".
type marginalGain struct {
	MinGain  float64 `json:"min_gain"`
	MinSteps int     `json:"min_steps"` // steady steps a measurement needs
}

func newMarginalGain(_ *heuristics.Registry, s heuristics.Spec) (heuristics.Heuristic, error) {
	p := &marginalGain{MinGain: 0.5, MinSteps: 15}
	// Strict: an unknown parameter (a typo) is an error, not ignored.
	if err := heuristics.DecodeParams(s.Params, p); err != nil {
		return nil, err
	}
	if p.MinGain <= 0 || p.MinSteps < 1 {
		return nil, fmt.Errorf("min_gain must be > 0 and min_steps ≥ 1, got %v and %d", p.MinGain, p.MinSteps)
	}
	return p, nil
}

func (*marginalGain) Name() string { return "marginal-gain" }

// Decide is called on the engine's goroutine every few steps while no earlier
// decision is being carried out; it must be quick (see heuristics.Background
// for policies that are not).
func (p *marginalGain) Decide(_ context.Context, h *heuristics.History) (heuristics.Decision, error) {
	k := h.Workers()
	if k < 1 {
		return heuristics.HoldBecause("no world yet"), nil
	}
	cur, ok := h.Latest(k, p.MinSteps)
	if !ok {
		return heuristics.HoldBecause("waiting for %d steady steps with %d workers", p.MinSteps, k), nil
	}
	numbers := map[string]float64{"throughput": cur.Throughput, "min_gain": p.MinGain}
	if prev, ok := h.Latest(k-1, p.MinSteps); ok {
		gain, per := cur.Throughput-prev.Throughput, prev.Throughput/float64(k-1)
		numbers["gain"], numbers["per_worker"] = gain, per
		if gain < p.MinGain*per {
			why := fmt.Sprintf("worker %d adds %.1f %s, under %.2g of %.1f per worker", k, gain, cur.Unit(), p.MinGain, per)
			if k <= h.MinWorkers {
				return heuristics.Decision{Action: heuristics.Hold, Settled: true, Numbers: numbers,
					Reason: fmt.Sprintf("%s, but the job needs %d", why, h.MinWorkers)}, nil
			}
			return heuristics.Decision{Action: heuristics.Shrink, Count: 1, Reason: why, Numbers: numbers}, nil
		}
	}
	if h.MaxWorkers > 0 && k >= h.MaxWorkers {
		return heuristics.Decision{Action: heuristics.Hold, Settled: true, Numbers: numbers,
			Reason: fmt.Sprintf("at the most workers allowed, %d", h.MaxWorkers)}, nil
	}
	if next, ok := h.Latest(k+1, p.MinSteps); ok {
		gain, per := next.Throughput-cur.Throughput, cur.Throughput/float64(k)
		numbers["next_gain"], numbers["next_per_worker"] = gain, per
		if gain < p.MinGain*per {
			return heuristics.Decision{Action: heuristics.Hold, Settled: true, Numbers: numbers,
				Reason: fmt.Sprintf("worker %d added only %.1f %s, under %.2g of %.1f per worker", k+1, gain, cur.Unit(), p.MinGain, per)}, nil
		}
	}
	return heuristics.Decision{Action: heuristics.Grow, Count: 1, Numbers: numbers,
		Reason: fmt.Sprintf("%.1f %s with %d workers, no loss measured yet; trying %d", cur.Throughput, cur.Unit(), k, k+1)}, nil
}
