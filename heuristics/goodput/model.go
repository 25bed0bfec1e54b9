package goodput

import (
	"errors"
	"fmt"
	"math"
)

// Model is a job's goodput function: its fitted throughput model, its
// gradient statistics and its initial batch size.
type Model struct {
	Perf PerfParams `json:"perf"`
	Grad GradParams `json:"grad"`
	// InitBatch is M0, the global batch the job started with (and its
	// learning rate is tuned for).
	InitBatch int `json:"init_batch"`
}

// Validate checks the model is usable.
func (m Model) Validate() error {
	if m.InitBatch < 1 {
		return fmt.Errorf("goodput: the initial batch size must be ≥ 1, got %d", m.InitBatch)
	}
	if !finite(m.Grad.Sqr) || !finite(m.Grad.Var) {
		return errors.New("goodput: gradient statistics are not finite")
	}
	return m.Perf.Validate()
}

// Efficiency is the statistical efficiency of global batch size batch.
func (m Model) Efficiency(batch int) float64 {
	return m.Grad.Efficiency(float64(batch) / float64(m.InitBatch))
}

// Throughput is samples per second with micro-batch micro on each of replicas
// spread over nodes, s extra micro-batches accumulated per step.
func (m Model) Throughput(nodes, replicas, micro, s int) float64 {
	return m.Perf.Throughput(nodes, replicas, micro, s)
}

// Goodput is throughput × efficiency: samples per second, counted in the
// progress a sample makes at the initial batch size. Meaningless arguments
// (fewer than one node, replica or sample, more nodes than replicas,
// negative accumulation) give 0.
func (m Model) Goodput(nodes, replicas, micro, s int) float64 {
	if nodes < 1 || replicas < nodes || micro < 1 || s < 0 {
		return 0
	}
	return m.goodput(replicas, micro, s, m.Perf.NetworkTime(nodes, replicas))
}

// goodput is Goodput with the network time given (the same for every
// candidate of an allocation).
func (m Model) goodput(replicas, micro, s int, net float64) float64 {
	acc := m.Perf.AccumTime(micro)
	batch := replicas * micro * (s + 1)
	step := float64(s)*acc + overlap(acc, net, m.Perf.Gamma)
	return float64(batch) / step * m.Efficiency(batch)
}

// Limits bound the batch sizes the optimizer may choose.
type Limits struct {
	// MaxBatch is the largest global batch M_max; 0 means the initial batch
	// (the batch size is then only split, never grown).
	MaxBatch int `json:"max_batch"`
	// MinMicroBatch is the smallest micro-batch per replica; 0 means 1.
	MinMicroBatch int `json:"min_micro_batch"`
	// MaxMicroBatch is the largest micro-batch per replica, what fits in a
	// replica's memory; 0 means MaxBatch.
	MaxMicroBatch int `json:"max_micro_batch"`
	// Accumulation allows gradient accumulation (s > 0) when a replica's
	// share exceeds MaxMicroBatch.
	Accumulation bool `json:"accumulation"`
}

// resolve applies the defaults for a job starting at initBatch.
func (l Limits) resolve(initBatch int) Limits {
	if l.MaxBatch == 0 {
		l.MaxBatch = initBatch
	}
	if l.MinMicroBatch == 0 {
		l.MinMicroBatch = 1
	}
	if l.MaxMicroBatch == 0 {
		l.MaxMicroBatch = l.MaxBatch
	}
	return l
}

// Resolved returns the limits with the defaults applied for a job starting
// at initBatch.
func (l Limits) Resolved(initBatch int) Limits { return l.resolve(initBatch) }

// Validate checks the limits against the initial batch size.
func (l Limits) Validate(initBatch int) error {
	if l.MaxBatch < 0 || l.MinMicroBatch < 0 || l.MaxMicroBatch < 0 {
		return errors.New("goodput: batch limits must not be negative")
	}
	r := l.resolve(initBatch)
	if r.MaxBatch < initBatch {
		return fmt.Errorf("goodput: the maximum batch %d is below the initial batch %d", r.MaxBatch, initBatch)
	}
	if r.MinMicroBatch > r.MaxMicroBatch {
		return fmt.Errorf("goodput: the micro-batch bounds [%d, %d] are empty", r.MinMicroBatch, r.MaxMicroBatch)
	}
	return nil
}

// Choice is a batch configuration for one allocation.
type Choice struct {
	MicroBatch int `json:"micro_batch"` // m, samples per replica per micro-batch
	Accum      int `json:"accum"`       // s, extra micro-batches accumulated per step
	// Goodput is the model's prediction for it (0: infeasible).
	Goodput float64 `json:"goodput"`
}

// Batch is the global batch of the choice on replicas replicas.
func (c Choice) Batch(replicas int) int { return replicas * c.MicroBatch * (c.Accum + 1) }

// GridPoints is the number of global batch sizes Optimize tries.
const GridPoints = 50

// SwitchSpeedup is the predicted goodput ratio a new choice must exceed for
// Reconsider to switch to it: changing the batch size costs something (a
// recompiled graph, a warm-up), and noise in the model should not make a job
// hop between near-equal choices.
const SwitchSpeedup = 1.05

// ceilTolerance keeps ceil from rounding up an exact ratio that floating point
// put a hair above an integer.
const ceilTolerance = 1e-8

// Optimize returns the batch configuration of highest goodput on replicas
// replicas spread over nodes nodes, as AdaptDL searches it: GridPoints global
// batch sizes M, geometrically spaced over [max(M0, K·m_min), M_max]; for
// each, s = ⌈M/K/m_max⌉ − 1 extra micro-batches when accumulating (at least
// one on a single replica once M > M0, so the gradient statistics have two
// micro-batches to come from), m = ⌈M/K/(s+1)⌉, or ⌊M_max/K/(s+1)⌋ where
// that would take the global batch K·m·(s+1) above M_max and the smaller one
// is not below max(M0, K·m_min); a configuration whose m falls
// outside [m_min, m_max] has goodput 0. The first best wins; ok is false when
// no configuration is feasible (the Choice then has goodput 0), also when
// K·m_min > M_max, or the arguments are invalid (see Limits.Validate). It
// allocates nothing.
func (m Model) Optimize(nodes, replicas int, lim Limits) (best Choice, ok bool) {
	if nodes < 1 || replicas < nodes || m.InitBatch < 1 || lim.Validate(m.InitBatch) != nil {
		return Choice{}, false
	}
	lim = lim.resolve(m.InitBatch)
	k := float64(replicas)
	lo := math.Max(float64(m.InitBatch), float64(lim.MinMicroBatch)*k)
	hi := float64(lim.MaxBatch)
	if lo > hi {
		// K replicas at their smallest micro-batch already exceed M_max
		// (numpy's geomspace would search downward and return a batch
		// above the user's maximum).
		return Choice{}, false
	}
	logLo, step := math.Log(lo), (math.Log(hi)-math.Log(lo))/(GridPoints-1)
	net := m.Perf.NetworkTime(nodes, replicas)
	best.Goodput = -1
	for i := range GridPoints {
		batch := math.Exp(logLo + float64(i)*step)
		switch i { // exact end points, as numpy's geomspace
		case 0:
			batch = lo
		case GridPoints - 1:
			batch = hi
		}
		local := batch / k
		s := 0
		if lim.Accumulation {
			s = max(0, int(math.Ceil(local/float64(lim.MaxMicroBatch)-ceilTolerance))-1)
			if replicas == 1 && local > float64(m.InitBatch)+ceilTolerance {
				s = max(s, 1)
			}
		}
		micro := int(math.Ceil(local/float64(s+1) - ceilTolerance))
		if down := lim.MaxBatch / (replicas * (s + 1)); replicas*micro*(s+1) > lim.MaxBatch && float64(replicas*down*(s+1)) >= lo {
			// Shares rounded up would add up to more than M_max: round
			// down, unless that falls below the smallest batch.
			micro = down
		}
		g := 0.0
		if micro >= lim.MinMicroBatch && micro <= lim.MaxMicroBatch {
			g = m.goodput(replicas, micro, s, net)
		}
		if g > best.Goodput {
			best = Choice{MicroBatch: micro, Accum: s, Goodput: g}
		}
	}
	return best, best.Goodput > 0
}

// Reconsider is the per-refit decision of a running job: the optimum on its
// allocation, taken only when its predicted goodput beats the current
// choice's by more than SwitchSpeedup (or the current choice is unset, or its
// micro-batch or accumulation no longer within the limits). It returns the choice to run with, the
// predicted speed-up of the optimum over the current choice, and whether that
// is a change. It allocates nothing.
func (m Model) Reconsider(nodes, replicas int, lim Limits, cur Choice) (next Choice, speedup float64, changed bool) {
	best, ok := m.Optimize(nodes, replicas, lim)
	if !ok {
		return cur, 0, false
	}
	r := lim.resolve(m.InitBatch)
	curGoodput := 0.0
	if cur.MicroBatch >= r.MinMicroBatch && cur.MicroBatch <= r.MaxMicroBatch && cur.Accum >= 0 && (cur.Accum == 0 || r.Accumulation) {
		curGoodput = m.Goodput(nodes, replicas, cur.MicroBatch, cur.Accum)
	}
	cur.Goodput = curGoodput
	speedup = best.Goodput / math.Max(curGoodput, 1e-8)
	if curGoodput == 0 || speedup > SwitchSpeedup {
		return best, speedup, best.MicroBatch != cur.MicroBatch || best.Accum != cur.Accum
	}
	return cur, speedup, false
}
