package heuristics

import (
	"context"
	"fmt"
	"math"
)

// efficiencyConfig is scaling-efficiency's parameters.
type efficiencyConfig struct {
	// Threshold is the least scaling efficiency a step must exceed: the
	// fraction of an average worker's throughput each added worker must add
	// (0.1 in Or et al.'s code).
	Threshold float64 `json:"threshold"`
	searchConfig
}

// scalingEfficiency grows the world while the throughput each added worker
// brings is worth more than Threshold of what a worker already does (Or,
// Zhang and Freedman's throughput scaling efficiency).
type scalingEfficiency struct {
	cfg    efficiencyConfig
	search *search
}

func newScalingEfficiency(_ *Registry, s Spec) (Heuristic, error) {
	cfg := efficiencyConfig{Threshold: 0.1, searchConfig: defaultSearchConfig()}
	if err := DecodeParams(s.Params, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.searchConfig.validate(); err != nil {
		return nil, err
	}
	if cfg.Threshold < 0 || math.IsNaN(cfg.Threshold) || math.IsInf(cfg.Threshold, 0) {
		return nil, fmt.Errorf("threshold must be a number ≥ 0, got %v", cfg.Threshold)
	}
	e := &scalingEfficiency{cfg: cfg}
	e.search = newSearch(cfg.searchConfig, e.pass)
	return e, nil
}

func (*scalingEfficiency) Name() string { return "scaling-efficiency" }

func (e *scalingEfficiency) Decide(_ context.Context, h *History) (Decision, error) {
	return e.search.decide(h), nil
}

// scalingEfficiencyOf is s = ((R_new − R_old)/(k_new − k_old)) / (R_old/k_old):
// the throughput each added worker brings, as a fraction of the throughput
// per worker before. ok is false when it is undefined.
func scalingEfficiencyOf(old, new Measurement) (s float64, ok bool) {
	if old.Workers < 1 || new.Workers == old.Workers || old.Throughput <= 0 {
		return 0, false
	}
	marginal := (new.Throughput - old.Throughput) / float64(new.Workers-old.Workers)
	return marginal / (old.Throughput / float64(old.Workers)), true
}

func (e *scalingEfficiency) pass(old, new Measurement, _ *History) (bool, string, map[string]float64) {
	nums := map[string]float64{
		"throughput_old": old.Throughput,
		"throughput_new": new.Throughput,
		"threshold":      e.cfg.Threshold,
	}
	s, ok := scalingEfficiencyOf(old, new)
	if !ok {
		return false, fmt.Sprintf("throughput %.1f→%.1f %s: no scaling efficiency (nothing measured at %d workers)",
			old.Throughput, new.Throughput, new.Unit(), old.Workers), nums
	}
	nums["efficiency"] = s
	cmp, pass := "≤", s > e.cfg.Threshold
	if pass {
		cmp = ">"
	}
	return pass, fmt.Sprintf("throughput %.1f→%.1f %s, scaling efficiency %.3f %s threshold %.3f",
		old.Throughput, new.Throughput, new.Unit(), s, cmp, e.cfg.Threshold), nums
}
