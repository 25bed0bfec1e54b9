package goodput

import (
	"math"
	"testing"
)

// TestOptimizeHandComputed checks the optimizer's choice on models whose
// optimum is worked out by hand.
func TestOptimizeHandComputed(t *testing.T) {
	// Compute-bound, efficiency 1 at every batch (sqr = 0: all noise), a
	// large fixed cost per micro-batch: the largest feasible micro-batch is
	// best, and the first of equal ones wins.
	bigFixed := PerfParams{AlphaC: 1, BetaC: 0.001, AlphaN: 1e-8, BetaN: 1e-8, AlphaR: 1e-8, BetaR: 1e-8, Gamma: 1}
	allNoise := GradParams{Sqr: 0, Var: 1}
	withSync := bigFixed
	withSync.AlphaR = 0.1
	for _, tc := range []struct {
		name            string
		model           Model
		nodes, replicas int
		lim             Limits
		want            Choice
		ok              bool
	}{
		// Grid: M_i = 100·10^(i/49). Without accumulation m = ⌈M/4⌉ must
		// stay ≤ 50: M_14 = 193.07 → m = 49 fits, M_15 = 202.43 → 51 does
		// not, so m = 49.
		{"4 replicas, micro-batch capped at 50", Model{bigFixed, allNoise, 100}, 1, 4,
			Limits{MaxBatch: 1000, MinMicroBatch: 10, MaxMicroBatch: 50}, Choice{MicroBatch: 49}, true},
		// One replica accumulating: the last point M = 1000 splits into
		// s = ⌈1000/200⌉ − 1 = 4 and m = 200, the largest micro-batch;
		// M_48 = 954.1 gives s = 4, m = 191.
		{"1 replica, accumulation to 1000", Model{bigFixed, allNoise, 100}, 1, 1,
			Limits{MaxBatch: 1000, MaxMicroBatch: 200, Accumulation: true}, Choice{MicroBatch: 200, Accum: 4}, true},
		// No batch growth allowed (MaxBatch 0 = M0 = 128): the batch is only
		// split, m = ⌈128/3⌉ = 43 (AdaptDL's test_optimize_no_bounds).
		{"split only", Model{bigFixed, allNoise, 128}, 1, 3, Limits{}, Choice{MicroBatch: 43}, true},
		// Efficiency falls as 1/r (no noise: sqr = 1, var at its floor) and
		// the compute time is all per-sample: every batch has the same
		// throughput and the smallest batch is best.
		{"no noise keeps M0", Model{PerfParams{AlphaC: 1e-8, BetaC: 0.001, AlphaN: 1e-8, BetaN: 1e-8, AlphaR: 0.01, BetaR: 1e-8, Gamma: 1}, GradParams{Sqr: 1, Var: 0}, 64}, 1, 2,
			Limits{MaxBatch: 4096}, Choice{MicroBatch: 32}, true},
		// Four replicas at their smallest micro-batch exceed M_max.
		{"min micro-batch above the maximum batch", Model{bigFixed, allNoise, 100}, 1, 4,
			Limits{MaxBatch: 100, MinMicroBatch: 30, MaxMicroBatch: 40}, Choice{}, false},
		// Every candidate needs a micro-batch above the maximum (M0/4 = 25 >
		// 20) and accumulation is not allowed: infeasible, the first
		// candidate returned with goodput 0.
		{"every micro-batch above the memory limit", Model{bigFixed, allNoise, 100}, 1, 4,
			Limits{MaxBatch: 1000, MaxMicroBatch: 20}, Choice{MicroBatch: 25}, false},
		// The same with accumulation, and a sync of 0.1 s paid once per
		// step (γ = 1: no overlap): throughput 80(s+1)/(1.02(s+1) + 0.1)
		// at m = 20 grows with s. The last point, M = 1000 (local 250,
		// s = ⌈250/20⌉ − 1 = 12), would take m = ⌈250/13⌉ = 20 to
		// 4·20·13 = 1040 > M_max: m = ⌊1000/52⌋ = 19, 988/13.35 = 74.0
		// samples/s. The point before, M_48 = 954.1 (local 238.5, s = 11,
		// m = 20: 960 samples), gives 960/12.34 = 77.8 and wins.
		{"accumulation under the memory limit", Model{withSync, allNoise, 100}, 1, 4,
			Limits{MaxBatch: 1000, MaxMicroBatch: 20, Accumulation: true}, Choice{MicroBatch: 20, Accum: 11}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.model.Optimize(tc.nodes, tc.replicas, tc.lim)
			if ok != tc.ok || got.MicroBatch != tc.want.MicroBatch || got.Accum != tc.want.Accum {
				t.Fatalf("Optimize = %+v, %v; want micro-batch %d, accum %d, %v", got, ok, tc.want.MicroBatch, tc.want.Accum, tc.ok)
			}
			if want := tc.model.Goodput(tc.nodes, tc.replicas, got.MicroBatch, got.Accum); ok && got.Goodput != want {
				t.Fatalf("goodput %v, want %v", got.Goodput, want)
			}
		})
	}
}

// TestOptimizeInteriorOptimum: one replica, no network, T = α + β·m and
// efficiency (φ+M0)/(φ+m) give goodput m(φ+M0)/((α+βm)(φ+m)), highest at
// m* = √(αφ/β) = √(0.1·1000/0.001) = 316.2. The grid's choice must be within
// one grid step of it and within 1 % of the best integer batch's goodput.
func TestOptimizeInteriorOptimum(t *testing.T) {
	const alpha, beta, phi, m0, mmax = 0.1, 0.001, 1000.0, 32, 4096
	mod := Model{Perf: PerfParams{AlphaC: alpha, BetaC: beta, AlphaN: 1, BetaN: 1, AlphaR: 1, BetaR: 1, Gamma: 1},
		Grad: GradParams{Sqr: 1, Var: phi / m0}, InitBatch: m0}
	got, ok := mod.Optimize(1, 1, Limits{MaxBatch: mmax})
	if !ok {
		t.Fatal("infeasible")
	}
	closed := func(m float64) float64 { return m * (phi + m0) / ((alpha + beta*m) * (phi + m)) }
	best := 0.0
	for m := m0; m <= mmax; m++ {
		best = math.Max(best, closed(float64(m)))
	}
	step := math.Pow(mmax/m0, 1.0/(GridPoints-1))
	if mstar := math.Sqrt(alpha * phi / beta); float64(got.MicroBatch) < mstar/step || float64(got.MicroBatch) > mstar*step {
		t.Errorf("micro-batch %d, want within a grid step (×%.3f) of %.1f", got.MicroBatch, step, mstar)
	}
	if got.Goodput < 0.99*best || math.Abs(got.Goodput-closed(float64(got.MicroBatch))) > 1e-6*best {
		t.Errorf("goodput %v; closed form %v there, best integer batch %v", got.Goodput, closed(float64(got.MicroBatch)), best)
	}
}

// TestOptimizeBounds ports AdaptDL's optimizer tests (test_optimize_*): on
// random models, for 1..40 replicas on one node and on as many nodes, the
// choice respects the bounds, covers M0, and keeps the batch under M_max
// but for rounding.
func TestOptimizeBounds(t *testing.T) {
	const m0 = 128
	for _, tc := range []struct {
		name string
		lim  Limits
	}{
		{"no bounds", Limits{}},
		{"local bounds", Limits{MaxBatch: 100 * m0, MinMicroBatch: 64, MaxMicroBatch: 256}},
		{"max batch", Limits{MaxBatch: 1280}},
		{"all bounds", Limits{MaxBatch: 1280, MinMicroBatch: 64, MaxMicroBatch: 256}},
		{"accumulation", Limits{MaxBatch: 1280, MinMicroBatch: 64, MaxMicroBatch: 256, Accumulation: true}},
		{"closed bounds", Limits{MaxBatch: 100 * m0, MinMicroBatch: 256, MaxMicroBatch: 256}},
		{"closed bounds, accumulation", Limits{MaxBatch: 100 * m0, MinMicroBatch: 256, MaxMicroBatch: 256, Accumulation: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.lim.resolve(m0)
			for mi, mod := range randomModels(20, 11) {
				mod.InitBatch = m0
				for k := 1; k <= 40; k++ {
					for _, nodes := range []int{1, k} {
						c, ok := mod.Optimize(nodes, k, tc.lim)
						if !ok {
							if c.Goodput != 0 {
								t.Fatalf("model %d, %d/%d: infeasible with goodput %v", mi, nodes, k, c.Goodput)
							}
							continue
						}
						batch := c.Batch(k)
						switch {
						case c.MicroBatch < r.MinMicroBatch || c.MicroBatch > r.MaxMicroBatch:
							t.Fatalf("model %d, %d/%d: micro-batch %d out of [%d, %d]", mi, nodes, k, c.MicroBatch, r.MinMicroBatch, r.MaxMicroBatch)
						case batch < m0:
							t.Fatalf("model %d, %d/%d: batch %d below M0", mi, nodes, k, batch)
						case batch > r.MaxBatch && r.MaxBatch/(k*(c.Accum+1))*k*(c.Accum+1) >= max(m0, k*r.MinMicroBatch):
							// Above the maximum only where no smaller split reaches the minimum.
							t.Fatalf("model %d, %d/%d: batch %d above the maximum %d", mi, nodes, k, batch, r.MaxBatch)
						case c.Accum > 0 && !tc.lim.Accumulation:
							t.Fatalf("model %d, %d/%d: accumulates without leave", mi, nodes, k)
						case c.Accum > 0 && c.MicroBatch*(c.Accum) < r.MaxMicroBatch && !(k == 1 && c.Accum == 1):
							// accumulation only once a replica's share exceeds the memory limit
							t.Fatalf("model %d, %d/%d: accumulates %d×%d below the memory limit %d", mi, nodes, k, c.Accum, c.MicroBatch, r.MaxMicroBatch)
						case k == 1 && tc.lim.Accumulation && batch > m0 && c.Accum == 0:
							t.Fatalf("model %d: one replica above M0 (%d) without accumulation", mi, batch)
						}
						if g := mod.Goodput(nodes, k, c.MicroBatch, c.Accum); g != c.Goodput {
							t.Fatalf("model %d, %d/%d: goodput %v, evaluated %v", mi, nodes, k, c.Goodput, g)
						}
					}
				}
				if c, _ := mod.Optimize(1, 1, tc.lim); tc.lim.MinMicroBatch <= m0 && !tc.lim.Accumulation && tc.lim.MaxBatch <= 1280 && c.MicroBatch < m0 {
					t.Fatalf("model %d: one replica chose %d < M0", mi, c.MicroBatch)
				}
			}
		})
	}
}

func TestReconsider(t *testing.T) {
	mod := Model{Perf: PerfParams{AlphaC: 0.1, BetaC: 0.001, AlphaN: 1, BetaN: 1, AlphaR: 1, BetaR: 1, Gamma: 1},
		Grad: GradParams{Sqr: 1, Var: 1000.0 / 32}, InitBatch: 32}
	lim := Limits{MaxBatch: 4096, MaxMicroBatch: 2048}
	best, _ := mod.Optimize(1, 1, lim)
	gp := func(m int) float64 { return mod.Goodput(1, 1, m, 0) }
	// A near-optimal choice: the batch where goodput is 3 % below the best.
	var near3, far int
	for m := best.MicroBatch; m >= 32; m-- {
		if near3 == 0 && gp(m) < best.Goodput/1.03 {
			near3 = m
		}
		if gp(m) < best.Goodput/1.2 {
			far = m
			break
		}
	}
	for _, tc := range []struct {
		name    string
		cur     Choice
		want    Choice
		changed bool
	}{
		{"unset takes the optimum", Choice{}, best, true},
		{"the optimum stays", Choice{MicroBatch: best.MicroBatch}, best, false},
		{"3 % worse stays", Choice{MicroBatch: near3}, Choice{MicroBatch: near3}, false},
		{"20 % worse switches", Choice{MicroBatch: far}, best, true},
		{"above the memory limit switches", Choice{MicroBatch: 3000}, best, true},
		{"accumulation not allowed switches", Choice{MicroBatch: best.MicroBatch / 2, Accum: 1}, best, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, speedup, changed := mod.Reconsider(1, 1, lim, tc.cur)
			if got.MicroBatch != tc.want.MicroBatch || got.Accum != tc.want.Accum || changed != tc.changed {
				t.Fatalf("Reconsider(%+v) = %+v, ×%.3f, %v; want %+v, %v", tc.cur, got, speedup, changed, tc.want, tc.changed)
			}
			if tc.cur.MicroBatch > 0 && tc.cur.MicroBatch <= lim.MaxMicroBatch && tc.cur.Accum == 0 {
				near(t, "speed-up", speedup, best.Goodput/gp(tc.cur.MicroBatch), 1e-12)
			}
		})
	}
}

func TestGoodputInvalidArguments(t *testing.T) {
	mod := randomModels(1, 3)[0]
	for _, c := range []config{{0, 1, 8, 0}, {2, 1, 8, 0}, {1, 1, 0, 0}, {1, 1, 8, -1}} {
		if g := mod.Goodput(c.nodes, c.replicas, c.micro, c.accum); g != 0 {
			t.Errorf("Goodput%+v = %v, want 0", c, g)
		}
	}
	for _, tc := range []struct {
		nodes, replicas int
		lim             Limits
	}{
		{0, 1, Limits{}}, {2, 1, Limits{}}, {1, 1, Limits{MaxBatch: 8}}, {1, 1, Limits{MinMicroBatch: 9, MaxMicroBatch: 8}}, {1, 1, Limits{MaxBatch: -1}},
	} {
		if c, ok := mod.Optimize(tc.nodes, tc.replicas, tc.lim); ok || c != (Choice{}) {
			t.Errorf("Optimize(%d, %d, %+v) = %+v, %v; want nothing", tc.nodes, tc.replicas, tc.lim, c, ok)
		}
	}
}

func TestEvaluationAllocatesNothing(t *testing.T) {
	mod := randomModels(1, 5)[0]
	lim := Limits{MaxBatch: 4096, MaxMicroBatch: 256, Accumulation: true}
	for name, f := range map[string]func(){
		"Goodput":    func() { mod.Goodput(2, 8, 32, 1) },
		"Optimize":   func() { mod.Optimize(2, 8, lim) },
		"Reconsider": func() { mod.Reconsider(2, 8, lim, Choice{MicroBatch: 32}) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times per call", name, n)
		}
	}
}

func TestEfficiencyAndLRRules(t *testing.T) {
	g := GradParams{Sqr: 2, Var: 6} // φ = M0·3
	for _, tc := range []struct {
		scale, gain float64
	}{
		{1, 1},
		// (6+2)/(6/2+2) = 8/5
		{2, 1.6},
		// (6+2)/(6/8+2) = 8/2.75
		{8, 8 / 2.75},
	} {
		near(t, "gain", g.Gain(tc.scale), tc.gain, 1e-12)
		near(t, "efficiency", g.Efficiency(tc.scale), tc.gain/tc.scale, 1e-12)
		// (φ+M0)/(φ+M) with M0 = 10, φ = 30
		near(t, "efficiency as noise scale", g.Efficiency(tc.scale), (30+10)/(30+10*tc.scale), 1e-12)
		near(t, "adascale", AdaScale.Factor(g, tc.scale), tc.gain, 1e-12)
		near(t, "sqrt", SqrtScale.Factor(g, tc.scale), math.Sqrt(tc.scale), 1e-12)
		near(t, "linear", LinearScale.Factor(g, tc.scale), tc.scale, 1e-12)
	}
	near(t, "noise scale", g.NoiseScale(10), 30, 1e-12)
	if !math.IsInf(GradParams{Sqr: 0, Var: 1}.NoiseScale(10), 1) {
		t.Error("noise scale with no signal is not +Inf")
	}
	// Floors: var below 1e-6 counts as 1e-6, a negative square as 0.
	near(t, "floored gain", GradParams{Sqr: -1, Var: 0}.Gain(4), 4, 1e-12)
	near(t, "floored efficiency", GradParams{Sqr: 1, Var: -5}.Efficiency(4), (1e-6+1)/(1e-6/4+1)/4, 1e-12)
	for _, s := range []string{"adascale", "AdaScale", "sqrt", "linear", ""} {
		r, err := ParseLRRule(s)
		if err != nil {
			t.Fatal(err)
		}
		var back LRRule
		b, _ := r.MarshalText()
		if err := back.UnmarshalText(b); err != nil || back != r {
			t.Errorf("%q: round trip %v → %s → %v, %v", s, r, b, back, err)
		}
	}
	if _, err := ParseLRRule("cubic"); err == nil {
		t.Error("unknown rule accepted")
	}
}
