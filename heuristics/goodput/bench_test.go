package goodput

import "testing"

// BenchmarkFit is one refit on 100 measured configurations (10 allocations ×
// 10 micro-batch sizes, 5 % noise): the work of a periodic refit.
func BenchmarkFit(b *testing.B) {
	truth := PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2.5}
	seen := [][2]int{{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 6}, {2, 2}, {2, 4}, {3, 6}, {4, 8}, {4, 16}}
	pts := synthetic(truth, grid(seen, []int{8, 16, 24, 32, 48, 64, 96, 128, 192, 256}, []int{0}), 5, 0.05, 1).Points()
	if len(pts) != 100 {
		b.Fatalf("%d points", len(pts))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Fit(pts); err != nil {
			b.Fatal(err)
		}
	}
}

func benchModel() Model {
	return Model{Perf: PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2.5},
		Grad: GradParams{Sqr: 1, Var: 20}, InitBatch: 128}
}

func BenchmarkGoodput(b *testing.B) {
	m := benchModel()
	b.ReportAllocs()
	sum := 0.0
	for i := 0; b.Loop(); i++ {
		sum += m.Goodput(2, 8, 32+i%64, i%3)
	}
	if sum <= 0 {
		b.Fatal(sum)
	}
}

func BenchmarkOptimize(b *testing.B) {
	m := benchModel()
	lim := Limits{MaxBatch: 8192, MaxMicroBatch: 256, Accumulation: true}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := m.Optimize(1+i%4, 4+i%13, lim); !ok {
			b.Fatal("infeasible")
		}
	}
}

// BenchmarkObserve is the estimator's per-step cost (the norms themselves
// are the sync layer's).
func BenchmarkObserve(b *testing.B) {
	est, _ := NewEstimator(EstimatorConfig{InitBatch: 128})
	n := StepNorms{Batch: 512, MicroBatches: 4, LocalSqr: 10, TotalSqr: 2}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := est.Observe(n); err != nil {
			b.Fatal(err)
		}
	}
}
