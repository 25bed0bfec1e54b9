package heuristics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// costConfig is the price of workers and the value of finishing the job,
// shared by utility-cost and goodput: embedded in their configurations, so
// its keys sit beside the policy's own.
type costConfig struct {
	// PricePerWorkerHour is what a worker costs (P, per hour).
	PricePerWorkerHour float64 `json:"price_per_worker_hour"`
	// Utility is the shape of the value of finishing at time T: "linear"
	// (value lost per hour of later completion) or "step" (a value earned
	// only by a deadline).
	Utility string `json:"utility"`
	// ValuePerHour is, for linear, the utility lost per hour the job
	// finishes later.
	ValuePerHour float64 `json:"value_per_hour"`
	// Value is, for step, earned if the job completes by Deadline.
	Value float64 `json:"value"`
	// Deadline is measured from History.Start.
	Deadline Duration `json:"deadline"`
	// TotalSteps overrides the job length the trainer reports.
	TotalSteps int64 `json:"total_steps"`
}

func (c costConfig) validate() error {
	var errs []error
	if !(c.PricePerWorkerHour > 0) || math.IsInf(c.PricePerWorkerHour, 0) {
		errs = append(errs, fmt.Errorf("price_per_worker_hour must be > 0, got %v", c.PricePerWorkerHour))
	}
	if c.TotalSteps < 0 {
		errs = append(errs, fmt.Errorf("total_steps must be ≥ 0, got %d", c.TotalSteps))
	}
	switch c.Utility {
	case "linear":
		if !(c.ValuePerHour > 0) || math.IsInf(c.ValuePerHour, 0) {
			errs = append(errs, fmt.Errorf("the linear utility needs value_per_hour > 0, got %v", c.ValuePerHour))
		}
		if c.Value != 0 || c.Deadline != 0 {
			errs = append(errs, errors.New(`value and deadline belong to the step utility (set "utility": "step")`))
		}
	case "step":
		if !(c.Value > 0) || math.IsInf(c.Value, 0) {
			errs = append(errs, fmt.Errorf("the step utility needs value > 0, got %v", c.Value))
		}
		if c.Deadline <= 0 {
			errs = append(errs, fmt.Errorf("the step utility needs a deadline > 0 (e.g. \"2h\"), got %v", time.Duration(c.Deadline)))
		}
		if c.ValuePerHour != 0 {
			errs = append(errs, errors.New(`value_per_hour belongs to the linear utility`))
		}
	default:
		errs = append(errs, fmt.Errorf(`utility must be "linear" or "step", got %q`, c.Utility))
	}
	return errors.Join(errs...)
}

// utilityOf is U(T), the value of completing completion seconds after the
// job started.
func (c costConfig) utilityOf(completion float64) float64 {
	if c.Utility == "step" {
		if completion <= time.Duration(c.Deadline).Seconds() {
			return c.Value
		}
		return 0
	}
	return -c.ValuePerHour * completion / 3600
}

// costOf is what workers workers cost for seconds.
func (c costConfig) costOf(seconds float64, workers int) float64 {
	return seconds * float64(workers) * c.PricePerWorkerHour / 3600
}

// totalSteps is the job's length: the configured one, else the trainer's.
func (c costConfig) totalSteps(h *History) int64 {
	if c.TotalSteps > 0 {
		return c.TotalSteps
	}
	return h.TotalSteps
}

// utilityConfig is utility-cost's parameters.
type utilityConfig struct {
	costConfig
	searchConfig
}

func (c utilityConfig) validate() error {
	return errors.Join(c.searchConfig.validate(), c.costConfig.validate())
}

// utilityCost compares, for two world sizes, the utility of the expected
// completion time with the cost of the workers until then (Or, Zhang and
// Freedman): a larger world is worth it when it gains more utility than it
// costs.
type utilityCost struct {
	cfg    utilityConfig
	search *search
}

func newUtilityCost(_ *Registry, s Spec) (Heuristic, error) {
	cfg := utilityConfig{costConfig: costConfig{Utility: "linear"}, searchConfig: defaultSearchConfig()}
	if err := DecodeParams(s.Params, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u := &utilityCost{cfg: cfg}
	u.search = newSearch(cfg.searchConfig, u.pass)
	return u, nil
}

func (*utilityCost) Name() string { return "utility-cost" }

func (u *utilityCost) Decide(_ context.Context, h *History) (Decision, error) {
	total := u.cfg.totalSteps(h)
	if total <= 0 {
		return HoldBecause("utility-cost needs the job's length: set total_steps, or have the trainer report its planned steps"), nil
	}
	if h.Step >= total {
		return HoldBecause("the job's %d steps are done", total), nil
	}
	return u.search.decide(h), nil
}

// outlook is what finishing the job at one world size looks like.
type outlook struct {
	stepTime   float64 // t_k, seconds
	completion float64 // T_k, seconds since the job started
	utility    float64 // U(T_k)
	cost       float64 // C(k), the remaining cost
}

// outlook is T_k = elapsed + b_k·t_k, U(T_k) and C(k) = t_k·b_k·k·P, where
// b_k is the b remaining steps of the current world's global batch counted in
// steps of k workers' (see remainingSeconds).
func (u *utilityCost) outlook(m Measurement, h *History, b float64, batch int) outlook {
	t := m.StepTime.Seconds()
	rest := remainingSeconds(m, b, batch)
	o := outlook{stepTime: t, completion: h.Now.Sub(h.Start).Seconds() + rest}
	o.cost = u.cfg.costOf(rest, m.Workers)
	o.utility = u.cfg.utilityOf(o.completion)
	return o
}

// remainingSeconds is how long b steps of batch samples each take at
// measurement m. A trainer that keeps the per-worker batch fixed has a global
// batch that grows with the world, so the same work takes fewer, larger steps
// in a larger one (Or et al. rescale the step counter by the old over the new
// global batch): the time is then the remaining samples over m's throughput.
// With a fixed global batch, or no samples reported, it is b·t_k.
func remainingSeconds(m Measurement, b float64, batch int) float64 {
	if m.GlobalBatch > 0 && batch > 0 && m.Throughput > 0 {
		return b * float64(batch) / m.Throughput
	}
	return b * m.StepTime.Seconds()
}

// currentBatch is the global batch of the current world's steps, the one the
// remaining steps are counted in (0 when the trainer reports no samples).
func currentBatch(h *History) int {
	cur := h.Current()
	if cur == nil {
		return 0
	}
	if m := cur.Measure(); m.Steps > 0 {
		return m.GlobalBatch
	}
	if n := len(cur.Steps); n > 0 {
		return cur.Steps[n-1].GlobalBatch
	}
	return 0
}

func (u *utilityCost) pass(old, new Measurement, h *History) (bool, string, map[string]float64) {
	b := float64(max(0, u.cfg.totalSteps(h)-h.Step))
	batch := currentBatch(h)
	o, n := u.outlook(old, h, b, batch), u.outlook(new, h, b, batch)
	du, dc := n.utility-o.utility, n.cost-o.cost
	nums := map[string]float64{
		"remaining_steps": b,
		"global_batch":    float64(batch),
		"step_time_old":   o.stepTime,
		"step_time_new":   n.stepTime,
		"completion_old":  o.completion,
		"completion_new":  n.completion,
		"utility_old":     o.utility,
		"utility_new":     n.utility,
		"cost_old":        o.cost,
		"cost_new":        n.cost,
		"delta_utility":   du,
		"delta_cost":      dc,
	}
	cmp, ok := "≤", du > dc
	if ok {
		cmp = ">"
	}
	why := fmt.Sprintf("step time %.4g→%.4g s, %d steps left, finishing %s→%s after the start, utility %.4g→%.4g, cost %.4g→%.4g: utility gain %.4g %s cost increase %.4g",
		o.stepTime, n.stepTime, int64(b), roundedDuration(o.completion), roundedDuration(n.completion),
		o.utility, n.utility, o.cost, n.cost, du, cmp, dc)
	return ok, why, nums
}

func roundedDuration(seconds float64) time.Duration {
	if seconds >= float64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(math.MaxInt64).Round(time.Second)
	}
	return time.Duration(seconds * float64(time.Second)).Round(time.Second)
}
