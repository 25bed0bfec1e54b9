package scheduler

import (
	"testing"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

func TestModelGoodput(t *testing.T) {
	m := goodput.Model{
		Perf:      goodput.PerfParams{AlphaC: 0.01, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.001, AlphaR: 0.01, BetaR: 0.0001, Gamma: 1},
		Grad:      goodput.GradParams{Sqr: 1, Var: 10},
		InitBatch: 64,
	}
	lim := goodput.Limits{MaxBatch: 1024, MinMicroBatch: 16, MaxMicroBatch: 128, Accumulation: true}
	f := ModelGoodput(m, lim)
	for _, a := range [][2]int{{1, 1}, {1, 4}, {2, 8}, {4, 16}} {
		c, ok := m.Optimize(a[0], a[1], lim)
		if !ok || f(a[0], a[1]) != c.Goodput || c.Goodput <= 0 {
			t.Errorf("%d nodes × %d replicas: %v, want the optimizer's %v", a[0], a[1], f(a[0], a[1]), c.Goodput)
		}
	}
	if f(4, 16) <= f(1, 1) {
		t.Errorf("16 replicas (%v) no faster than 1 (%v)", f(4, 16), f(1, 1))
	}
	// 128 replicas at the smallest micro-batch exceed the largest batch.
	if g := f(32, 128); g != 0 {
		t.Errorf("an infeasible allocation has goodput %v, want 0", g)
	}
}
