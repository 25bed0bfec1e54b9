package heuristics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// goodputConfig is goodput's parameters.
type goodputConfig struct {
	// InitBatch is M0, the global batch the job started with and its
	// learning rate is tuned for; 0 takes the first reported step's.
	InitBatch int `json:"init_batch"`
	// The batch sizes the job may run with at any world size
	// (goodput.Limits): the largest global batch (0: InitBatch, the batch
	// is then only split), the smallest and largest micro-batch per worker
	// (0: 1 and MaxBatch; the largest is what fits in a worker's memory),
	// and whether the job accumulates gradients beyond that.
	MaxBatch      int  `json:"max_batch"`
	MinMicroBatch int  `json:"min_micro_batch"`
	MaxMicroBatch int  `json:"max_micro_batch"`
	Accumulation  bool `json:"accumulation"`
	// WorkersPerNode is how many workers share a machine: the model tells
	// a sync within a machine from one across machines (1: every worker
	// on its own machine).
	WorkersPerNode int `json:"workers_per_node"`
	// Threshold is, without a price, the least goodput each added worker
	// must add, as a fraction of the goodput per worker before it (the
	// scaling efficiency of Or et al., in goodput).
	Threshold float64 `json:"threshold"`
	// Hysteresis keeps the size when successive fits disagree by little:
	// without a price, a worker is added only if it adds more than
	// Threshold + Hysteresis, and removed only if it adds at most
	// Threshold − Hysteresis; with one, another size must beat the
	// current one's utility minus cost by more than Hysteresis of what the
	// remaining work contributes to it (the value less the utility of
	// finishing now).
	// Each refit moves the predictions a little (new steps, new gradient
	// statistics), and a size whose worker sits at the threshold would
	// otherwise be left and taken again at every refit, each time paying
	// a transition.
	Hysteresis float64 `json:"hysteresis"`
	// MinSteps is how many steady steps the current world needs before it
	// is judged; EvalEvery bounds how often an unchanged world is judged
	// again, in committed steps.
	MinSteps  int `json:"min_steps"`
	EvalEvery int `json:"eval_every"`
	// With a price per worker-hour, the size is the one of highest utility
	// minus cost instead (utility-cost's parameters).
	costConfig
}

func (c *goodputConfig) validate() error {
	var errs []error
	for _, v := range []struct {
		name string
		n    int
	}{{"init_batch", c.InitBatch}, {"max_batch", c.MaxBatch}, {"min_micro_batch", c.MinMicroBatch}, {"max_micro_batch", c.MaxMicroBatch}} {
		if v.n < 0 {
			errs = append(errs, fmt.Errorf("%s must be ≥ 0, got %d", v.name, v.n))
		}
	}
	if c.InitBatch > 0 {
		if err := c.limits().Validate(c.InitBatch); err != nil {
			errs = append(errs, errors.New(trimPkg(err)))
		}
	}
	if c.WorkersPerNode < 1 {
		errs = append(errs, fmt.Errorf("workers_per_node must be at least 1, got %d", c.WorkersPerNode))
	}
	if c.Threshold < 0 || math.IsNaN(c.Threshold) || math.IsInf(c.Threshold, 0) {
		errs = append(errs, fmt.Errorf("threshold must be a number ≥ 0, got %v", c.Threshold))
	}
	if c.Hysteresis < 0 || math.IsNaN(c.Hysteresis) || math.IsInf(c.Hysteresis, 0) {
		errs = append(errs, fmt.Errorf("hysteresis must be a number ≥ 0, got %v", c.Hysteresis))
	}
	if c.MinSteps < 1 {
		errs = append(errs, fmt.Errorf("min_steps must be at least 1, got %d", c.MinSteps))
	}
	if c.EvalEvery < 1 {
		errs = append(errs, fmt.Errorf("eval_every must be at least 1, got %d", c.EvalEvery))
	}
	if c.priced() {
		if c.Utility == "" {
			c.Utility = "linear"
		}
		errs = append(errs, c.costConfig.validate())
	} else if c.costConfig != (costConfig{}) {
		errs = append(errs, errors.New("utility, value_per_hour, value, deadline and total_steps need price_per_worker_hour > 0"))
	}
	return errors.Join(errs...)
}

func (c *goodputConfig) priced() bool { return c.PricePerWorkerHour != 0 }

func (c *goodputConfig) limits() goodput.Limits {
	return goodput.Limits{MaxBatch: c.MaxBatch, MinMicroBatch: c.MinMicroBatch, MaxMicroBatch: c.MaxMicroBatch, Accumulation: c.Accumulation}
}

func trimPkg(err error) string {
	const p = "goodput: "
	if s := err.Error(); len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return err.Error()
}

// goodputHeuristic chooses the world size by predicted goodput (AdaptDL /
// Pollux): it fits the throughput model to the steps measured at every size
// tried so far, takes the gradient statistics the workers report, and
// predicts each size's goodput with the batch size the job would pick there
// (goodput.Model.Optimize). Without a price it grows while each added worker
// adds more than Threshold of a worker's goodput; with one it takes the size
// of highest utility minus cost, the time to finish coming from the goodput
// (Or et al.'s utility against cost, counting progress rather than samples).
// As in Pollux, it never goes beyond twice the largest size measured, where
// the model would be extrapolating: a job explores 1, 2, 4, ... only while
// the model keeps predicting a gain.
type goodputHeuristic struct {
	cfg goodputConfig

	judged      bool
	judgedEpoch uint64
	judgedStep  int64
}

func newGoodput(_ *Registry, s Spec) (Heuristic, error) {
	cfg := goodputConfig{WorkersPerNode: 1, Threshold: 0.1, Hysteresis: 0.05, MinSteps: 20, EvalEvery: 10}
	if err := DecodeParams(s.Params, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &goodputHeuristic{cfg: cfg}, nil
}

func (*goodputHeuristic) Name() string { return "goodput" }

func (g *goodputHeuristic) Decide(_ context.Context, h *History) (Decision, error) {
	cur := h.Current()
	if cur == nil {
		return HoldBecause("no world yet"), nil
	}
	k := cur.Workers()
	if m := cur.Measure(); m.Steps < g.cfg.MinSteps {
		return HoldBecause("measuring %s: %d/%d steps", plural(k, "worker"), m.Steps, g.cfg.MinSteps), nil
	}
	if g.judged && g.judgedEpoch == cur.Epoch && h.Step-g.judgedStep < int64(g.cfg.EvalEvery) {
		return HoldBecause("%s: next evaluation at step %d", plural(k, "worker"), g.judgedStep+int64(g.cfg.EvalEvery)), nil
	}
	g.judged, g.judgedEpoch, g.judgedStep = true, cur.Epoch, h.Step

	model, prof, why, err := g.model(h)
	if err != nil {
		return Decision{}, err
	}
	if why != "" {
		return HoldBecause("%s", why), nil
	}
	lim := g.cfg.limits()
	explore := 2 * prof.MaxReplicas() // Pollux: at most twice the largest measured
	lo, hi := max(h.MinWorkers, 1), explore
	if h.MaxWorkers > 0 {
		hi = min(hi, h.MaxWorkers)
	}
	hi = max(hi, lo, k)
	choices := make([]goodput.Choice, hi+1)
	for n := min(lo, k); n <= hi; n++ {
		choices[n], _ = model.Optimize(g.nodes(n), n, lim)
	}

	var target int
	var how string
	noise := model.Grad.NoiseScale(model.InitBatch)
	nums := map[string]float64{
		"workers": float64(k), "init_batch": float64(model.InitBatch), "configurations": float64(prof.Len()),
		"grad_sqr": model.Grad.Sqr, "grad_var": model.Grad.Var,
		"alpha_c": model.Perf.AlphaC, "beta_c": model.Perf.BetaC, "alpha_n": model.Perf.AlphaN, "beta_n": model.Perf.BetaN,
		"alpha_r": model.Perf.AlphaR, "beta_r": model.Perf.BetaR, "gamma": model.Perf.Gamma,
	}
	if g.cfg.priced() {
		var ok bool
		if target, how, ok = g.byValue(h, model.InitBatch, choices, lo, k, nums); !ok {
			return HoldBecause("%s", how), nil
		}
	} else {
		target, how = g.withHysteresis(choices, lo, k, nums)
	}
	noiseText := "unbounded (no gradient signal measured)"
	if !math.IsInf(noise, 0) { // Numbers are logged as JSON, which has no infinity
		nums["noise_scale"], noiseText = noise, fmt.Sprintf("%.4g", noise)
	}
	nums["target"] = float64(target)
	nums["goodput"], nums["goodput_target"] = choices[k].Goodput, choices[target].Goodput
	nums["micro_batch_target"], nums["accum_target"] = float64(choices[target].MicroBatch), float64(choices[target].Accum)

	summary := fmt.Sprintf("fitted on %d configurations, noise scale %s: predicted goodput %s",
		prof.Len(), noiseText, g.describe(choices, k, k))
	if target != k {
		summary += ", " + g.describe(choices, target, k)
	}
	d := Decision{Numbers: nums}
	exploring := target == explore && (h.MaxWorkers == 0 || explore < h.MaxWorkers)
	switch {
	case choices[target].Goodput <= 0:
		d.Action, d.Reason = Hold, fmt.Sprintf("%s; no size from %d to %d has a feasible batch size within the limits", summary, lo, hi)
	case target > k:
		d.Action, d.Count = Grow, target-k
		d.Reason = fmt.Sprintf("%s; %s: growing by %d", summary, how, target-k)
		if exploring {
			d.Reason += " (twice the largest size measured: the model is checked there before going further)"
		}
	case target < k:
		d.Action, d.Count = Shrink, k-target
		d.Reason = fmt.Sprintf("%s; %s: shrinking by %d", summary, how, k-target)
	default:
		d.Action, d.Settled = Hold, true
		d.Reason = fmt.Sprintf("%s; %s: settled", summary, how)
	}
	return d, nil
}

// nodes is how many machines n workers take.
func (g *goodputHeuristic) nodes(n int) int {
	return (n + g.cfg.WorkersPerNode - 1) / g.cfg.WorkersPerNode
}

func (g *goodputHeuristic) describe(choices []goodput.Choice, n, k int) string {
	c := choices[n]
	if c.Goodput <= 0 {
		return fmt.Sprintf("%s: no feasible batch", plural(n, "worker"))
	}
	s := fmt.Sprintf("%s %.4g samples/s at batch %d (%d×%d", plural(n, "worker"), c.Goodput, c.Batch(n), n, c.MicroBatch)
	if c.Accum > 0 {
		s += fmt.Sprintf("×%d", c.Accum+1)
	}
	s += ")"
	if n != k && choices[k].Goodput > 0 {
		s += fmt.Sprintf(", ×%.3f", c.Goodput/choices[k].Goodput)
	}
	return s
}

// withHysteresis is byEfficiency with the hysteresis band: the size grows
// to where every added worker adds more than Threshold + Hysteresis, shrinks
// to where every worker kept adds more than Threshold − Hysteresis, and
// stays where it is in between. (A lower threshold never gives a smaller
// size: byEfficiency stops at the first worker that does not pass.)
func (g *goodputHeuristic) withHysteresis(choices []goodput.Choice, lo, k int, nums map[string]float64) (int, string) {
	up, upWhy := g.byEfficiency(choices, lo, g.cfg.Threshold+g.cfg.Hysteresis, nums)
	keep, keepWhy := g.byEfficiency(choices, lo, g.cfg.Threshold-g.cfg.Hysteresis, nil)
	switch {
	case up > k:
		return up, upWhy
	case keep < k:
		return keep, keepWhy
	case g.cfg.Hysteresis == 0:
		return k, upWhy
	}
	return k, fmt.Sprintf("%s, within the hysteresis band: a worker is added when it adds more than %.3g (that gives %d) and removed when it adds at most %.3g (that gives %d)",
		plural(k, "worker"), g.cfg.Threshold+g.cfg.Hysteresis, up, g.cfg.Threshold-g.cfg.Hysteresis, keep)
}

// byEfficiency is, from the smallest feasible size, the largest up to which
// every added worker adds more than threshold of the goodput per worker
// before it. It records the efficiencies in nums unless nums is nil.
func (g *goodputHeuristic) byEfficiency(choices []goodput.Choice, lo int, threshold float64, nums map[string]float64) (int, string) {
	target := lo
	for target < len(choices)-1 && choices[target].Goodput <= 0 {
		target++ // too few workers to hold the batch within the limits
	}
	for n := target + 1; n < len(choices); n++ {
		prev, next := choices[n-1].Goodput, choices[n].Goodput
		if next <= 0 {
			return target, fmt.Sprintf("%s cannot hold a batch within the limits", plural(n, "worker"))
		}
		eff := (next - prev) / (prev / float64(n-1))
		if nums != nil {
			nums[fmt.Sprintf("efficiency_%d", n)] = eff
		}
		if eff <= threshold {
			return target, fmt.Sprintf("worker %d would add %.3g of a worker's goodput, ≤ threshold %.3g", n, eff, threshold)
		}
		target = n
	}
	return target, fmt.Sprintf("every worker up to %d adds more than %.3g of a worker's goodput", target, threshold)
}

// byValue is the size of highest utility minus cost: the remaining work is
// the remaining steps at M0 samples each, and goodput (samples per second at
// M0's efficiency) says how long it takes. ok is false when the job's length
// is unknown or done.
func (g *goodputHeuristic) byValue(h *History, m0 int, choices []goodput.Choice, lo, k int, nums map[string]float64) (target int, how string, ok bool) {
	total := g.cfg.totalSteps(h)
	if total <= 0 {
		return 0, "goodput with a price needs the job's length: set total_steps, or have the trainer report its planned steps", false
	}
	if h.Step >= total {
		return 0, fmt.Sprintf("the job's %d steps are done", total), false
	}
	work := float64(total-h.Step) * float64(m0)
	elapsed := h.Now.Sub(h.Start).Seconds()
	best := math.Inf(-1)
	nums["remaining_steps"] = float64(total - h.Step)
	for n := lo; n < len(choices); n++ {
		if choices[n].Goodput <= 0 {
			continue
		}
		rest := work / choices[n].Goodput
		v := g.cfg.utilityOf(elapsed+rest) - g.cfg.costOf(rest, n)
		nums[fmt.Sprintf("value_%d", n)] = v
		if v > best {
			best, target = v, n
		}
	}
	if target == 0 {
		return lo, "no size has a feasible batch size", true
	}
	// The hysteresis compares what the remaining work changes: the value
	// less the utility of finishing now.
	if cur, ok := nums[fmt.Sprintf("value_%d", k)]; ok && target != k {
		if rest := cur - g.cfg.utilityOf(elapsed); best-cur <= g.cfg.Hysteresis*math.Abs(rest) {
			return k, fmt.Sprintf("%s's utility minus cost %.4g is within the hysteresis (%.3g of the remaining work's %.4g) of the best, %s's %.4g",
				plural(k, "worker"), cur, g.cfg.Hysteresis, rest, plural(target, "worker"), best), true
		}
	}
	rest := work / choices[target].Goodput
	return target, fmt.Sprintf("%s finish %s after the start at utility %.4g for cost %.4g, the best utility minus cost",
		plural(target, "worker"), roundedDuration(elapsed+rest), g.cfg.utilityOf(elapsed+rest), g.cfg.costOf(rest, target)), true
}

// model builds the goodput model from the history: M0, the newest gradient
// statistics, and the throughput model fitted to every steady step. why is
// set when the history cannot give one yet; err when the job cannot give one
// (the trainer does not report what the model needs, which the engine then
// logs once) or the configuration does not fit the job.
func (g *goodputHeuristic) model(h *History) (m goodput.Model, prof *goodput.Profile, why string, err error) {
	m.InitBatch = g.cfg.InitBatch
	if m.InitBatch == 0 {
		m.InitBatch = firstBatch(h)
		if m.InitBatch == 0 {
			return m, nil, "", errors.New("the trainer reports no samples: goodput needs the batch size")
		}
		if err := g.cfg.limits().Validate(m.InitBatch); err != nil {
			return m, nil, "", fmt.Errorf("with the initial batch %d from the first step: %s", m.InitBatch, trimPkg(err))
		}
	}
	grad, ok := newestGradStats(h)
	if !ok {
		return m, nil, "", errors.New("no gradient statistics reported: the trainer must measure the gradient noise (the adaptive training loop does)")
	}
	m.Grad = grad
	prof = &goodput.Profile{}
	for _, p := range h.Periods {
		k := p.Workers()
		for _, s := range p.Steady() {
			if o, ok := g.observation(k, s); ok {
				_ = prof.Add(o) // observation() only returns valid ones
			}
		}
	}
	if prof.Len() == 0 {
		return m, nil, "no step with samples and times measured yet", nil
	}
	if m.Perf, err = prof.Fit(); err != nil {
		return m, nil, "", err
	}
	return m, prof, "", nil
}

// observation turns a step of k workers into the throughput model's input:
// the micro-batch from the global batch, the sync time as the step time
// beyond the members' mean compute time.
func (g *goodputHeuristic) observation(k int, s StepStats) (goodput.Observation, bool) {
	if s.GlobalBatch <= 0 || s.Time <= 0 || k < 1 || s.Accum < 0 {
		return goodput.Observation{}, false
	}
	per := k * (s.Accum + 1)
	micro := (s.GlobalBatch + per - 1) / per
	var compute time.Duration
	for _, c := range s.Compute {
		compute += c
	}
	if len(s.Compute) > 0 {
		compute /= time.Duration(len(s.Compute))
	}
	step := s.Time.Seconds()
	sync := min(max(0, step-compute.Seconds()), step*0.999)
	return goodput.Observation{Nodes: g.nodes(k), Replicas: k, MicroBatch: micro, Accum: s.Accum, StepTime: step, SyncTime: sync}, true
}

// firstBatch is the global batch of the job's first reported step.
func firstBatch(h *History) int {
	for _, p := range h.Periods {
		for _, s := range p.Steps {
			if s.GlobalBatch > 0 {
				return s.GlobalBatch
			}
		}
	}
	return 0
}

// newestGradStats is the newest step's gradient statistics.
func newestGradStats(h *History) (goodput.GradParams, bool) {
	for i := len(h.Periods) - 1; i >= 0; i-- {
		steps := h.Periods[i].Steps
		for j := len(steps) - 1; j >= 0; j-- {
			if s := steps[j]; s.GradVar > 0 {
				return goodput.GradParams{Sqr: s.GradSqr, Var: s.GradVar}, true
			}
		}
	}
	return goodput.GradParams{}, false
}
