package goodput

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// gradientSource draws micro-batch gradients as the mean of b per-sample
// gradients G + ξ, ξ ~ N(0, diag(σ²)): G + N(0, diag(σ²)/b). Its true
// statistics are sqr = ‖G‖² and var = tr(Σ)/M0 = Σσ²/M0.
type gradientSource struct {
	g, sigma []float64
	rng      *rand.Rand
}

func newGradientSource(dim int, seed uint64) *gradientSource {
	s := &gradientSource{g: make([]float64, dim), sigma: make([]float64, dim), rng: rand.New(rand.NewPCG(seed, 17))}
	for i := range dim {
		s.g[i] = 0.15 * math.Sin(float64(i)) // ‖G‖² ≈ 0.0225·dim/2
		s.sigma[i] = 0.2 + 0.3*float64(i%5)  // an uneven covariance
	}
	return s
}

func (s *gradientSource) truth(m0 int) GradParams {
	var sqr, tr float64
	for i := range s.g {
		sqr += s.g[i] * s.g[i]
		tr += s.sigma[i] * s.sigma[i]
	}
	return GradParams{Sqr: sqr, Var: tr / float64(m0)}
}

func (s *gradientSource) micro(dst []float64, b int) {
	sd := 1 / math.Sqrt(float64(b))
	for i := range dst {
		dst[i] = s.g[i] + s.sigma[i]*sd*s.rng.NormFloat64()
	}
}

func normSqr(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return s
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// syncLayer plays the sync layer's part for one job: each step, replicas ×
// (accum+1) micro-batches of micro samples; each replica sums its micro-batch
// gradients' squared norms before accumulating, the allreduce sums those and
// averages the gradients, and with a single micro-batch the previous step's
// gradient is kept for the pair.
type syncLayer struct {
	src                   *gradientSource
	replicas, accum, size int
	micro, avg, prev      []float64
	hasPrev               bool
}

func (l *syncLayer) step() StepNorms {
	c := l.replicas * (l.accum + 1)
	clear(l.avg)
	local := 0.0
	for range c {
		l.src.micro(l.micro, l.size)
		local += normSqr(l.micro)
		for i, x := range l.micro {
			l.avg[i] += x / float64(c)
		}
	}
	n := StepNorms{Batch: c * l.size, MicroBatches: c, LocalSqr: local, TotalSqr: normSqr(l.avg)}
	if c == 1 {
		if l.hasPrev {
			n.HasPrev, n.PrevSqr, n.PrevDot = true, normSqr(l.prev), dot(l.prev, l.avg)
		}
		copy(l.prev, l.avg)
		l.hasPrev = true
	} else {
		l.hasPrev = false
	}
	return n
}

// TestEstimatorUnbiased feeds the estimator gradients of known statistics,
// measured as the sync layer would, for replica / accumulation / micro-batch
// mixes including the consecutive-steps case, and checks that the mean of
// the per-step estimates is the truth within 4 standard errors (each under
// 1 % of it), and that the smoothed estimate averaged over the second half of the
// run is within 3 % of it too. (The smoothed value at any one step wanders:
// a window of ~1000·M0/M steps of estimates whose spread is several times
// the gradient's square itself, at this noise scale, φ ≈ 70.)
func TestEstimatorUnbiased(t *testing.T) {
	const dim, m0, steps = 64, 32, 20000
	for _, tc := range []struct {
		name                  string
		replicas, accum, size int
	}{
		{"4 replicas", 4, 0, 8},
		{"2 replicas × 2 micro-batches", 2, 1, 16},
		{"1 replica × 4 micro-batches", 1, 3, 32},
		{"1 replica, consecutive steps", 1, 0, 32},
		{"8 replicas of 64 (M = 16·M0)", 8, 0, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newGradientSource(dim, 42)
			want := src.truth(m0)
			l := &syncLayer{src: src, replicas: tc.replicas, accum: tc.accum, size: tc.size,
				micro: make([]float64, dim), avg: make([]float64, dim), prev: make([]float64, dim)}
			est, err := NewEstimator(EstimatorConfig{InitBatch: m0})
			if err != nil {
				t.Fatal(err)
			}
			var n, sumSqr, sumVar, sum2Sqr, sum2Var, smoothSqr, smoothVar float64
			for i := range steps {
				e, err := est.Observe(l.step())
				if err != nil {
					t.Fatal(err)
				}
				if i >= steps/2 {
					smoothSqr += est.Params().Sqr / (steps / 2)
					smoothVar += est.Params().Var / (steps / 2)
				}
				if !e.Used {
					continue
				}
				n++
				sumSqr += e.Sqr
				sumVar += e.Var
				sum2Sqr += e.Sqr * e.Sqr
				sum2Var += e.Var * e.Var
			}
			for _, v := range []struct {
				name       string
				sum, sum2  float64
				want, ewma float64
			}{{"sqr", sumSqr, sum2Sqr, want.Sqr, smoothSqr}, {"var", sumVar, sum2Var, want.Var, smoothVar}} {
				mean := v.sum / n
				se := math.Sqrt((v.sum2/n - mean*mean) / n)
				t.Logf("%s: mean %.5g ± %.2g over %.0f estimates, smoothed %.5g, truth %.5g", v.name, mean, se, n, v.ewma, v.want)
				if se > 0.01*v.want {
					t.Fatalf("%s: the standard error %.2g is too large for the test to tell", v.name, se)
				}
				if math.Abs(mean-v.want) > 4*se {
					t.Errorf("%s: mean estimate %.5g ± %.2g, truth %.5g", v.name, mean, se, v.want)
				}
				if math.Abs(v.ewma-v.want) > 0.03*v.want {
					t.Errorf("%s: smoothed %.5g, truth %.5g", v.name, v.ewma, v.want)
				}
			}
		})
	}
}

// TestEstimatorHandComputed checks the formulas, the smoothing and the bias
// correction on numbers worked out by hand (M0 = 4).
func TestEstimatorHandComputed(t *testing.T) {
	est, _ := NewEstimator(EstimatorConfig{InitBatch: 4})
	if est.Ready() || est.Params() != (GradParams{Sqr: 1, Var: MinVar}) {
		t.Fatalf("fresh estimator: ready %v, %+v", est.Ready(), est.Params())
	}
	// c = 2, M = 8: local = 10/2 = 5, total = 3;
	// sqr = (2·3 − 5)/1 = 1, var = (5 − 3)·(8/4)/1 = 4.
	e, err := est.Observe(StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 10, TotalSqr: 3})
	if err != nil || !e.Used || e.Pair || e.Sqr != 1 || e.Var != 4 {
		t.Fatalf("step 1: %+v, %v", e, err)
	}
	// The bias correction makes the first average the estimate itself.
	near(t, "sqr after 1", est.Params().Sqr, 1, 1e-12)
	near(t, "var after 1", est.Params().Var, 4, 1e-12)
	// c = 4, M = 8: local = 24/4 = 6, total = 2;
	// sqr = (4·2 − 6)/3 = 2/3, var = (6 − 2)·2/3 = 8/3.
	e, _ = est.Observe(StepNorms{Batch: 8, MicroBatches: 4, LocalSqr: 24, TotalSqr: 2})
	near(t, "sqr 2", e.Sqr, 2.0/3, 1e-12)
	near(t, "var 2", e.Var, 8.0/3, 1e-12)
	// θ = 0.999^2 both steps: biased = θ(1−θ)·x1 + (1−θ)·x2, unbias =
	// θ(1−θ) + (1−θ), so the average is (θ·x1 + x2)/(θ + 1).
	th := 0.999 * 0.999
	near(t, "sqr after 2", est.Params().Sqr, (th*1+2.0/3)/(th+1), 1e-12)
	near(t, "var after 2", est.Params().Var, (th*4+8.0/3)/(th+1), 1e-12)

	// Consecutive steps, M = 4: the first has no pair.
	if e, _ := est.Observe(StepNorms{Batch: 4, MicroBatches: 1, TotalSqr: 5}); e.Used {
		t.Fatalf("first single step used: %+v", e)
	}
	// ‖g_prev‖² = 5, ‖g‖² = 3, ⟨g_prev, g⟩ = 1: local = 4, total =
	// (5 + 3 + 2)/4 = 2.5; c = 2 over 2M = 8 samples: sqr = 2·2.5 − 4 = 1,
	// var = (4 − 2.5)·2 = 3.
	e, _ = est.Observe(StepNorms{Batch: 4, MicroBatches: 1, TotalSqr: 3, HasPrev: true, PrevSqr: 5, PrevDot: 1})
	if !e.Used || !e.Pair {
		t.Fatalf("pair not used: %+v", e)
	}
	near(t, "pair sqr", e.Sqr, 1, 1e-12)
	near(t, "pair var", e.Var, 3, 1e-12)
	// The biased averages continue from the unbiased ones (AdaptDL resets
	// only on the way back).
	near(t, "sqr after pair", est.Params().Sqr, (th*th*1+th*2.0/3+1)/(th*th+th+1), 1e-12)
	if !est.State().Consecutive || est.State().Estimates != 3 {
		t.Fatalf("state %+v", est.State())
	}
	// Back to c > 1: the averages restart from this step.
	est.Observe(StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 10, TotalSqr: 3})
	near(t, "sqr after reset", est.Params().Sqr, 1, 1e-12)
	near(t, "var after reset", est.Params().Var, 4, 1e-12)

	// Floors: a negative sqr estimate reads as 0, a var below 1e-6 as 1e-6.
	est2, _ := NewEstimator(EstimatorConfig{InitBatch: 4})
	est2.Observe(StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 2, TotalSqr: 3}) // local 1 < total 3
	if p := est2.Params(); p.Sqr != 5 || p.Var != MinVar {
		t.Fatalf("floors: %+v", p)
	}
	est2.Observe(StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 20, TotalSqr: 0}) // sqr −10
	if p := est2.Params(); p.Sqr != 0 {
		t.Fatalf("floors: %+v", p)
	}
}

// TestEstimatorPairs: a pair is only formed from consecutive single
// micro-batch steps of the same batch size.
func TestEstimatorPairs(t *testing.T) {
	one := func(batch int, hasPrev bool) StepNorms {
		return StepNorms{Batch: batch, MicroBatches: 1, TotalSqr: 2, HasPrev: hasPrev, PrevSqr: 2, PrevDot: 1}
	}
	for _, tc := range []struct {
		name  string
		steps []StepNorms
		used  bool // the last step's
	}{
		{"consecutive", []StepNorms{one(8, false), one(8, true)}, true},
		{"caller has no previous gradient", []StepNorms{one(8, false), one(8, false)}, false},
		{"batch changed", []StepNorms{one(8, false), one(16, true)}, false},
		{"after a multi-micro-batch step", []StepNorms{{Batch: 8, MicroBatches: 2, LocalSqr: 4, TotalSqr: 1}, one(8, true)}, false},
		{"after a rejected step", []StepNorms{one(8, false), {Batch: 8, MicroBatches: 1, TotalSqr: math.NaN()}, one(8, true)}, false},
		{"after a restore", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			est, _ := NewEstimator(EstimatorConfig{InitBatch: 8})
			steps := tc.steps
			if steps == nil {
				est.Observe(one(8, false))
				if err := est.Restore(est.State()); err != nil {
					t.Fatal(err)
				}
				steps = []StepNorms{one(8, true)}
			}
			var e Estimate
			for _, s := range steps {
				e, _ = est.Observe(s)
			}
			if e.Used != tc.used {
				t.Fatalf("used %v, want %v", e.Used, tc.used)
			}
		})
	}
}

func TestEstimatorErrors(t *testing.T) {
	for _, cfg := range []EstimatorConfig{{InitBatch: 0}, {InitBatch: 8, Smoothing: 1}, {InitBatch: 8, Smoothing: -0.5}, {InitBatch: 8, Smoothing: math.NaN()}} {
		if _, err := NewEstimator(cfg); err == nil {
			t.Errorf("NewEstimator(%+v) accepted", cfg)
		}
	}
	est, _ := NewEstimator(EstimatorConfig{InitBatch: 8})
	for _, tc := range []struct {
		n    StepNorms
		want error
	}{
		{StepNorms{Batch: 8, MicroBatches: 0, TotalSqr: 1}, ErrBadStep},
		{StepNorms{Batch: 2, MicroBatches: 4, LocalSqr: 1, TotalSqr: 1}, ErrBadStep},
		{StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: math.Inf(1), TotalSqr: 1}, ErrNonFinite},
		{StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 1, TotalSqr: math.NaN()}, ErrNonFinite},
		{StepNorms{Batch: 8, MicroBatches: 1, TotalSqr: 1, HasPrev: true, PrevSqr: 1, PrevDot: math.NaN()}, ErrNonFinite},
		{StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: -1, TotalSqr: 1}, ErrNegative},
		{StepNorms{Batch: 8, MicroBatches: 1, TotalSqr: 1, HasPrev: true, PrevSqr: -1}, ErrNegative},
	} {
		if _, err := est.Observe(tc.n); !errors.Is(err, tc.want) {
			t.Errorf("Observe(%+v) = %v, want %v", tc.n, err, tc.want)
		}
	}
	if est.Ready() || est.State().Estimates != 0 {
		t.Fatal("rejected steps counted")
	}
	for _, s := range []EstimatorState{{SqrBiased: math.NaN()}, {SqrUnbias: 2}, {VarUnbias: -1}, {Estimates: -1}} {
		if err := est.Restore(s); err == nil {
			t.Errorf("Restore(%+v) accepted", s)
		}
	}
	// A state survives a round trip.
	est.Observe(StepNorms{Batch: 8, MicroBatches: 2, LocalSqr: 10, TotalSqr: 3})
	other, _ := NewEstimator(EstimatorConfig{InitBatch: 8})
	if err := other.Restore(est.State()); err != nil || other.Params() != est.Params() {
		t.Fatalf("restored %+v, %v; want %+v", other.Params(), err, est.Params())
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	est, _ := NewEstimator(EstimatorConfig{InitBatch: 8})
	n := StepNorms{Batch: 32, MicroBatches: 4, LocalSqr: 10, TotalSqr: 2}
	if a := testing.AllocsPerRun(100, func() { est.Observe(n) }); a != 0 {
		t.Errorf("Observe allocates %v times", a)
	}
}
