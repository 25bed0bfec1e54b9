package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/gorovod/gorovod/heuristics"
)

type policy struct {
	minGain  float64 // of the per-worker throughput
	minSteps int     // steady steps a measurement needs to be trusted
}

func main() {
	var p policy
	flag.Float64Var(&p.minGain, "min-gain", 0.5, "an added worker must add this fraction of a worker's throughput")
	flag.IntVar(&p.minSteps, "min-steps", 5, "steady steps a measurement needs")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("heuristic-plugin: ")
	if err := run(p, os.Stdin, os.Stdout); err != nil {
		// A non-zero exit makes the engine log the error with this stderr
		// and keep the world as it is.
		log.Fatal(err)
	}
}

func run(p policy, in io.Reader, out io.Writer) error {
	var h heuristics.PluginHistory
	if err := json.NewDecoder(in).Decode(&h); err != nil {
		return fmt.Errorf("reading the history: %w", err)
	}
	if h.Protocol != heuristics.PluginProtocol {
		return fmt.Errorf("history is protocol %d, this plugin speaks %d", h.Protocol, heuristics.PluginProtocol)
	}
	d := p.decide(&h)
	log.Printf("step %d, %d workers: %s", h.Step, h.Workers, d)
	return json.NewEncoder(out).Encode(d)
}

func (p policy) decide(h *heuristics.PluginHistory) heuristics.Decision {
	k := h.Workers
	if k < 1 {
		return hold(false, "no world yet")
	}
	byWorkers := map[int]float64{}
	for _, m := range h.Measurements {
		if m.Steps >= p.minSteps && m.Throughput > 0 {
			byWorkers[m.Workers] = m.Throughput
		}
	}
	tk, ok := byWorkers[k]
	if !ok {
		return hold(false, fmt.Sprintf("waiting for %d steady steps with %d workers", p.minSteps, k))
	}
	numbers := map[string]float64{"throughput": tk, "min_gain": p.minGain}
	if t, ok := byWorkers[k-1]; ok {
		gain, per := tk-t, t/float64(k-1)
		numbers["gain"], numbers["per_worker"] = gain, per
		if gain < p.minGain*per {
			why := fmt.Sprintf("worker %d adds %.1f/s, under %.2g of %.1f/s per worker", k, gain, p.minGain, per)
			if k <= h.MinWorkers {
				// Returns diminish: a worker more would pay even less.
				d := hold(true, why+", but the job needs "+fmt.Sprint(h.MinWorkers))
				d.Numbers = numbers
				return d
			}
			return heuristics.Decision{Action: heuristics.Shrink, Count: 1, Reason: why, Numbers: numbers}
		}
	}
	if h.MaxWorkers > 0 && k >= h.MaxWorkers {
		d := hold(true, fmt.Sprintf("at the most workers allowed, %d", h.MaxWorkers))
		d.Numbers = numbers
		return d
	}
	if t, ok := byWorkers[k+1]; ok {
		gain, per := t-tk, tk/float64(k)
		numbers["next_gain"], numbers["next_per_worker"] = gain, per
		if gain < p.minGain*per {
			d := hold(true, fmt.Sprintf("worker %d added only %.1f/s, under %.2g of %.1f/s per worker", k+1, gain, p.minGain, per))
			d.Numbers = numbers
			return d
		}
	}
	return heuristics.Decision{Action: heuristics.Grow, Count: 1, Numbers: numbers,
		Reason: fmt.Sprintf("%.1f/s with %d workers, no loss measured yet; trying %d", tk, k, k+1)}
}

func hold(settled bool, reason string) heuristics.Decision {
	return heuristics.Decision{Action: heuristics.Hold, Reason: reason, Settled: settled}
}
