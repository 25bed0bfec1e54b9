package heuristics

import (
	"errors"
	"fmt"
	"maps"
)

// searchConfig holds the parameters of the grow / shrink / settle search that
// scaling-efficiency and utility-cost share. It is embedded in their
// configurations, so its keys sit beside the policy's own.
type searchConfig struct {
	// GrowBy is how many workers a growing step adds (Or et al.'s spawn size).
	GrowBy int `json:"grow_by"`
	// MinSteps is how many steady steps a world size must be measured over
	// before it is judged.
	MinSteps int `json:"min_steps"`
	// EvalEvery bounds how often a world that stays the same is judged again,
	// in committed steps; a new world is judged as soon as it has MinSteps.
	EvalEvery int `json:"eval_every"`
}

func defaultSearchConfig() searchConfig {
	return searchConfig{GrowBy: 4, MinSteps: 20, EvalEvery: 10}
}

func (c searchConfig) validate() error {
	var errs []error
	if c.GrowBy < 1 {
		errs = append(errs, fmt.Errorf("grow_by must be at least 1, got %d", c.GrowBy))
	}
	if c.MinSteps < 1 {
		errs = append(errs, fmt.Errorf("min_steps must be at least 1, got %d", c.MinSteps))
	}
	if c.EvalEvery < 1 {
		errs = append(errs, fmt.Errorf("eval_every must be at least 1, got %d", c.EvalEvery))
	}
	return errors.Join(errs...)
}

// passFunc judges whether going from old.Workers to new.Workers (old has
// fewer) is worth it; reason and numbers explain the judgement.
type passFunc func(old, new Measurement, h *History) (ok bool, reason string, numbers map[string]float64)

type searchPhase int

const (
	phaseGrowing searchPhase = iota
	phaseShrinking
	phaseSettled
)

func (p searchPhase) String() string {
	switch p {
	case phaseGrowing:
		return "growing"
	case phaseShrinking:
		return "shrinking"
	}
	return "settled"
}

// search is Or, Zhang and Freedman's procedure: grow by GrowBy while every
// step passes; at the first failure search downward one worker at a time for
// the largest size that still passes against the size below it; then hold
// there, restoring it when workers are lost.
//
// Only the phase and the two sizes bounding it (upper, target) are kept:
// every measurement comes from the History on each call, because the engine
// may clamp or not carry out a decision and workers may fail, so what the
// search asked for is not necessarily what it got.
type search struct {
	cfg  searchConfig
	pass passFunc

	phase  searchPhase
	upper  int // shrinking: the largest size under consideration
	target int // settled: the size to keep

	// The last judgement, to judge an unchanged world at most every EvalEvery
	// steps rather than on every call.
	judged      bool
	judgedEpoch uint64
	judgedStep  int64
}

func newSearch(cfg searchConfig, pass passFunc) *search {
	return &search{cfg: cfg, pass: pass}
}

func (s *search) decide(h *History) Decision {
	cur := h.Current()
	if cur == nil {
		return HoldBecause("no world yet")
	}
	k := cur.Workers()
	m := cur.Measure()
	if m.Steps < s.cfg.MinSteps {
		return HoldBecause("measuring %s: %d/%d steps", plural(k, "worker"), m.Steps, s.cfg.MinSteps)
	}
	if s.judged && s.judgedEpoch == cur.Epoch && h.Step-s.judgedStep < int64(s.cfg.EvalEvery) {
		d := HoldBecause("%s (%s): next evaluation at step %d", plural(k, "worker"), s.phase, s.judgedStep+int64(s.cfg.EvalEvery))
		d.Settled = s.phase == phaseSettled && k >= s.target
		return d
	}
	s.judged, s.judgedEpoch, s.judgedStep = true, cur.Epoch, h.Step

	switch s.phase {
	case phaseGrowing:
		return s.grow(h, m)
	case phaseShrinking:
		return s.shrink(h, m, nil)
	}
	return s.settled(h, k)
}

// comparison is one judgement of pass: whether going from old to new workers
// is worth it, why, and the figures.
type comparison struct {
	old, new Measurement
	ok       bool
	why      string
	nums     map[string]float64
}

func (s *search) compare(old, new Measurement, h *History) *comparison {
	ok, why, nums := s.pass(old, new, h)
	return &comparison{old: old, new: new, ok: ok, why: why, nums: nums}
}

// decision reports an action, explained by the comparison c when there is
// one (what follows its reason), by the current measurement otherwise.
func decision(a Action, n int, cur Measurement, c *comparison, what string) Decision {
	if c == nil {
		return Decision{Action: a, Count: n,
			Reason:  fmt.Sprintf("%s: %.1f %s; %s", plural(cur.Workers, "worker"), cur.Throughput, cur.Unit(), what),
			Numbers: map[string]float64{"workers": float64(cur.Workers), "throughput": cur.Throughput}}
	}
	numbers := maps.Clone(c.nums)
	if numbers == nil {
		numbers = map[string]float64{}
	}
	numbers["workers_old"], numbers["workers_new"] = float64(c.old.Workers), float64(c.new.Workers)
	return Decision{Action: a, Count: n, Numbers: numbers,
		Reason: fmt.Sprintf("%d→%d workers: %s; %s", c.old.Workers, c.new.Workers, c.why, what)}
}

// settle ends the search at target with the decision that reaches it.
func (s *search) settle(target int, a Action, n int, cur Measurement, c *comparison, what string) Decision {
	s.phase, s.target = phaseSettled, target
	d := decision(a, n, cur, c, what)
	d.Settled = true
	return d
}

func (s *search) grow(h *History, cur Measurement) Decision {
	k := cur.Workers
	prev, ok := s.previous(h, k)
	if !ok {
		if next := h.Clamp(k + s.cfg.GrowBy); next > k {
			return decision(Grow, next-k, cur, nil, fmt.Sprintf("the first size measured; growing by %d to compare", next-k))
		}
		// Starting at the largest size allowed says nothing about whether it
		// pays off: search downward from it rather than settle blindly.
		s.phase, s.upper = phaseShrinking, k
		return s.shrink(h, cur, nil)
	}

	if prev.Workers < k {
		c := s.compare(prev, cur, h)
		if !c.ok {
			s.phase, s.upper = phaseShrinking, k
			return s.shrink(h, cur, c)
		}
		next := h.Clamp(k + s.cfg.GrowBy)
		if next <= k {
			return s.settle(k, Hold, 0, cur, c, fmt.Sprintf("at the maximum; settled at %d", k))
		}
		return decision(Grow, next-k, cur, c, fmt.Sprintf("growing by %d", next-k))
	}

	// The world shrank without being asked (a failure, or an operator): were
	// the lost workers worth having? If so, grow back; if not, the larger size
	// is out of the search, which goes on downward from here.
	c := s.compare(cur, prev, h)
	if c.ok {
		if n := h.Clamp(prev.Workers) - k; n > 0 {
			return decision(Grow, n, cur, c, fmt.Sprintf("workers were lost; growing back by %d", n))
		}
	}
	s.phase, s.upper = phaseShrinking, k
	return s.shrink(h, cur, c)
}

// shrink is the downward search at the current size. failed, when not nil,
// is the comparison that failed just above (it explains a shrink that has no
// comparison of its own).
func (s *search) shrink(h *History, cur Measurement, failed *comparison) Decision {
	c := cur.Workers
	// An operator may have added workers mid-search: their size becomes the
	// top of the search.
	s.upper = max(s.upper, c)
	if c < s.upper {
		if above, ok := h.Latest(c+1, s.cfg.MinSteps); ok {
			cmp := s.compare(cur, above, h)
			if cmp.ok {
				return s.settle(c+1, Grow, 1, cur, cmp, fmt.Sprintf("settling at %d", c+1))
			}
			failed = cmp
		} else if back := s.measuredAbove(h, c); back > c {
			// Reached only when workers were lost while searching (a shrink
			// by one leaves c+1 measured): go back to where the search was
			// rather than settle below sizes never compared.
			if n := h.Clamp(back) - c; n > 0 {
				return decision(Grow, n, cur, nil, fmt.Sprintf("%d is not measured (workers were lost while searching); growing back by %d to %d", c+1, n, c+n))
			}
		}
	}
	if c-1 < max(h.MinWorkers, 1) {
		return s.settle(c, Hold, 0, cur, failed, fmt.Sprintf("%s is the minimum; settled", plural(c, "worker")))
	}
	if below, ok := h.Latest(c-1, s.cfg.MinSteps); ok {
		cmp := s.compare(below, cur, h)
		if cmp.ok {
			d := s.settle(c, Hold, 0, cur, cmp, fmt.Sprintf("settled at %d", c))
			if failed != nil {
				// Settling takes both sides: c+1 did not pay off, c does.
				d.Reason = fmt.Sprintf("%d→%d workers: %s; %s", failed.old.Workers, failed.new.Workers, failed.why, d.Reason)
				for k, v := range failed.nums {
					d.Numbers["above_"+k] = v
				}
			}
			return d
		}
		return decision(Shrink, 1, cur, cmp, "shrinking by 1")
	}
	return decision(Shrink, 1, cur, failed, fmt.Sprintf("shrinking by 1 to measure %d", c-1))
}

func (s *search) settled(h *History, k int) Decision {
	nums := map[string]float64{"workers": float64(k), "target": float64(s.target)}
	switch {
	case k < s.target:
		if n := h.Clamp(s.target) - k; n > 0 {
			return Decision{Action: Grow, Count: n, Numbers: nums,
				Reason: fmt.Sprintf("%s, below the settled %d: restoring the settled size, growing by %d", plural(k, "worker"), s.target, n)}
		}
		// The bounds no longer allow the target: hold where they allow.
		return Decision{Action: Hold, Settled: true, Numbers: nums,
			Reason: fmt.Sprintf("%s, below the settled %d, which the worker bounds no longer allow", plural(k, "worker"), s.target)}
	case k > s.target:
		return Decision{Action: Hold, Settled: true, Numbers: nums,
			Reason: fmt.Sprintf("%s, above the settled %d: workers were added from outside; holding", plural(k, "worker"), s.target)}
	}
	return Decision{Action: Hold, Settled: true, Numbers: nums, Reason: fmt.Sprintf("settled at %s", plural(k, "worker"))}
}

// previous is the newest measurement, before the current period, of a world
// size other than k. Periods too short to judge (a transition cut short) are
// passed over.
func (s *search) previous(h *History, k int) (Measurement, bool) {
	for i := len(h.Periods) - 2; i >= 0; i-- {
		p := h.Periods[i]
		if p.Workers() == k {
			continue
		}
		if m := p.Measure(); m.Steps >= s.cfg.MinSteps {
			return m, true
		}
	}
	return Measurement{}, false
}

// measuredAbove is the smallest size in (c, upper] with a measurement, or 0.
func (s *search) measuredAbove(h *History, c int) int {
	for k := c + 1; k <= s.upper; k++ {
		if _, ok := h.Latest(k, s.cfg.MinSteps); ok {
			return k
		}
	}
	return 0
}

// plural is "1 worker", "2 workers".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
