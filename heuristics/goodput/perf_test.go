package goodput

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// randomModels draws models as AdaptDL's goodput_test does: each parameter
// from a gamma distribution of shape 2 and scale 2 (γ kept to its bounds).
func randomModels(n int, seed uint64) []Model {
	g := distuv.Gamma{Alpha: 2, Beta: 0.5, Src: rand.New(rand.NewPCG(seed, 1))}
	out := make([]Model, n)
	for i := range out {
		out[i] = Model{
			Perf: PerfParams{AlphaC: g.Rand(), BetaC: g.Rand(), AlphaN: g.Rand(), BetaN: g.Rand(),
				AlphaR: g.Rand(), BetaR: g.Rand(), Gamma: min(max(g.Rand(), MinGamma), MaxGamma)},
			Grad:      GradParams{Sqr: g.Rand(), Var: g.Rand()},
			InitBatch: 16,
		}
	}
	return out
}

type config struct{ nodes, replicas, micro, accum int }

// TestModelProperties checks AdaptDL's invariants on random models over the
// grid its test uses: goodput = throughput × efficiency, efficiency in (0, 1]
// and never rising with the batch size, throughput rising with the
// micro-batch with diminishing returns, throughput per replica never rising
// as replicas are added.
func TestModelProperties(t *testing.T) {
	var cfgs []config
	for _, n := range []int{1, 2, 3, 4} {
		for _, k := range []int{1, 2, 4, 8} {
			for _, m := range []int{8, 12, 16, 20, 24} {
				for _, s := range []int{0, 1, 2, 3, 4} {
					if n <= k && 16 <= k*m*(s+1) {
						cfgs = append(cfgs, config{n, k, m, s})
					}
				}
			}
		}
	}
	const tol = 1e-9
	for i, mod := range randomModels(100, 7) {
		tp := map[config]float64{}
		type be struct {
			batch int
			eff   float64
		}
		var effs []be
		for _, c := range cfgs {
			thr := mod.Throughput(c.nodes, c.replicas, c.micro, c.accum)
			batch := c.replicas * c.micro * (c.accum + 1)
			eff := mod.Efficiency(batch)
			g := mod.Goodput(c.nodes, c.replicas, c.micro, c.accum)
			if !(thr > 0) || !(eff > 0 && eff <= 1+tol) {
				t.Fatalf("model %d %+v: throughput %v, efficiency %v", i, c, thr, eff)
			}
			if math.Abs(g-thr*eff) > tol*g {
				t.Fatalf("model %d %+v: goodput %v ≠ throughput %v × efficiency %v", i, c, g, thr, eff)
			}
			tp[c] = thr
			effs = append(effs, be{batch, eff})
		}
		sort.Slice(effs, func(a, b int) bool { return effs[a].batch < effs[b].batch })
		for j := 1; j < len(effs); j++ {
			if effs[j].eff > effs[j-1].eff*(1+tol) {
				t.Fatalf("model %d: efficiency rises from batch %d (%v) to %d (%v)", i, effs[j-1].batch, effs[j-1].eff, effs[j].batch, effs[j].eff)
			}
		}
		for _, c := range cfgs {
			// Along the micro-batch: rising, slopes falling.
			var xs []int
			for _, m := range []int{8, 12, 16, 20, 24} {
				if _, ok := tp[config{c.nodes, c.replicas, m, c.accum}]; ok {
					xs = append(xs, m)
				}
			}
			for j := 1; j < len(xs); j++ {
				y0, y1 := tp[config{c.nodes, c.replicas, xs[j-1], c.accum}], tp[config{c.nodes, c.replicas, xs[j], c.accum}]
				if y1 < y0*(1-tol) {
					t.Fatalf("model %d %+v: throughput falls from micro-batch %d to %d", i, c, xs[j-1], xs[j])
				}
				if j >= 2 {
					ym := tp[config{c.nodes, c.replicas, xs[j-2], c.accum}]
					s0 := (y0 - ym) / float64(xs[j-1]-xs[j-2])
					s1 := (y1 - y0) / float64(xs[j]-xs[j-1])
					if s1 > s0+tol*math.Abs(s0)+1e-12 {
						t.Fatalf("model %d %+v: no diminishing returns at micro-batch %d: slope %v then %v", i, c, xs[j-1], s0, s1)
					}
				}
			}
			// Along the replicas: throughput per replica never rises.
			prev := math.Inf(1)
			for _, k := range []int{1, 2, 4, 8} {
				thr, ok := tp[config{c.nodes, k, c.micro, c.accum}]
				if !ok {
					continue
				}
				if per := thr / float64(k); per > prev*(1+tol) {
					t.Fatalf("model %d %+v: throughput per replica rises to %v at %d replicas (was %v)", i, c, per, k, prev)
				} else {
					prev = per
				}
			}
		}
	}
}

// TestPerfParamsHandComputed checks the model's formulas on numbers worked
// out by hand.
func TestPerfParamsHandComputed(t *testing.T) {
	p := PerfParams{AlphaC: 0.01, BetaC: 0.001, AlphaN: 0.03, BetaN: 0.002, AlphaR: 0.004, BetaR: 0.001, Gamma: 2}
	for _, tc := range []struct {
		name                  string
		nodes, replicas, m, s int
		acc, net, step        float64
	}{
		// T_acc = 0.01 + 0.001·20 = 0.03; one replica: T_net = 1e-8 + 1e-8·1e-8.
		// T_opt = √(0.03² + 1e-16) = 0.03 (to 1e-15).
		{"one replica", 1, 1, 20, 0, 0.03, 1e-8 + 1e-16, 0.03},
		// Two replicas on a node: T_net = 0.004 + 0.001·1e-8; T_opt = √(0.03² + 0.004²) = 0.030265.
		{"two replicas one node", 1, 2, 20, 0, 0.03, 0.004 + 1e-11, math.Sqrt(0.03*0.03 + 0.004*0.004)},
		// Six replicas on two nodes: T_net = 0.03 + 0.002·4 = 0.038;
		// T_opt = √(0.03² + 0.038²) = 0.048415; s = 3: T_iter = 0.09 + 0.048415.
		{"six replicas two nodes, s=3", 2, 6, 20, 3, 0.03, 0.038, 0.09 + math.Sqrt(0.03*0.03+0.038*0.038)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near(t, "T_acc", p.AccumTime(tc.m), tc.acc, 1e-12)
			near(t, "T_net", p.NetworkTime(tc.nodes, tc.replicas), tc.net, 1e-12)
			near(t, "T_iter", p.StepTime(tc.nodes, tc.replicas, tc.m, tc.s), tc.step, 1e-9)
			near(t, "throughput", p.Throughput(tc.nodes, tc.replicas, tc.m, tc.s), float64(tc.replicas*tc.m*(tc.s+1))/tc.step, 1e-9)
		})
	}
	// γ = 10 is close to the max; γ = 1 the sum.
	near(t, "overlap γ=1", overlap(0.03, 0.04, 1), 0.07, 1e-12)
	near(t, "overlap γ=10", overlap(0.03, 0.04, 10), 0.04*math.Pow(1+math.Pow(0.75, 10), 0.1), 1e-12)
	near(t, "overlap no underflow", overlap(1e-40, 1e-40, 10), 1e-40*math.Pow(2, 0.1), 1e-52)
}

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.15g, want %.15g", what, got, want)
	}
}

func TestPerfParamsValidate(t *testing.T) {
	good := PerfParams{AlphaC: 1, BetaC: 1, AlphaN: 1, BetaN: 1, AlphaR: 1, BetaR: 1, Gamma: 1}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*PerfParams){
		func(p *PerfParams) { p.AlphaC = 0 },
		func(p *PerfParams) { p.BetaN = math.Inf(1) },
		func(p *PerfParams) { p.BetaR = math.NaN() },
		func(p *PerfParams) { p.Gamma = 0.5 },
		func(p *PerfParams) { p.Gamma = 11 },
	} {
		p := good
		bad(&p)
		if p.Validate() == nil {
			t.Errorf("%+v: no error", p)
		}
	}
}
