package heuristics

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// FitGoodput fits the same model the goodput heuristic decides with (the
// hand-computed job of goodput_test.go), takes the gradient statistics when
// the trainer reports them and assumes efficiency 1 when it does not, and
// counts a base profile (a job's earlier driver's) with its history's steps,
// leaving the base as it was.
func TestFitGoodput(t *testing.T) {
	noGrad := func(m measured) measured { m.v, m.sqr = 0, 0; return m }
	profileOf := func(h *History) *goodput.Profile {
		_, prof, err := FitGoodput(h, nil, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return prof
	}
	for _, tc := range []struct {
		name      string
		h         *History
		base      *goodput.Profile
		initBatch int
		err       error
		grad      bool
		profiled  int
		goodput2  float64 // predicted at 2 workers on 2 machines, within 1 %
	}{
		{name: "nothing measured", h: &History{}, err: ErrNotMeasured},
		{name: "steps inside the skipped ones", h: func() *History {
			h := goodputHistory(oneWorker)
			h.Periods[0].Skip = 30
			return h
		}(), err: ErrNotMeasured},
		{name: "two sizes, gradient statistics", h: goodputHistory(oneWorker, twoWorkers), grad: true, profiled: 2, goodput2: 800},
		{name: "two sizes, no gradient statistics", h: goodputHistory(noGrad(oneWorker), noGrad(twoWorkers)), profiled: 2, goodput2: 800},
		{name: "M0 given", h: goodputHistory(oneWorker, twoWorkers), initBatch: 64, grad: true, profiled: 2, goodput2: 800},
		{name: "nothing measured since a profile of two sizes", h: &History{}, base: profileOf(goodputHistory(oneWorker, twoWorkers)),
			initBatch: 64, profiled: 2, goodput2: 800},
		{name: "nothing measured since, M0 not given", h: &History{}, base: profileOf(goodputHistory(oneWorker, twoWorkers)), err: ErrNotMeasured},
		{name: "one size before, the other since", h: goodputHistory(twoWorkers), base: profileOf(goodputHistory(oneWorker)),
			grad: true, profiled: 2, goodput2: 800},
		{name: "the other size before, one since", h: goodputHistory(oneWorker), base: profileOf(goodputHistory(twoWorkers)),
			grad: true, profiled: 2, goodput2: 800},
	} {
		t.Run(tc.name, func(t *testing.T) {
			baseWas := tc.base.Entries()
			m, prof, err := FitGoodput(tc.h, tc.base, tc.initBatch, 1)
			if got := tc.base.Entries(); !slices.Equal(got, baseWas) {
				t.Errorf("the base profile changed: %+v, was %+v", got, baseWas)
			}
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("FitGoodput = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.InitBatch != 64 || prof.MaxReplicas() != tc.profiled || (m.Grad.Var > 0) != tc.grad {
				t.Errorf("model %+v, profiled %d; want M0 64, profiled %d, gradient statistics %v", m, prof.MaxReplicas(), tc.profiled, tc.grad)
			}
			c, ok := m.Optimize(2, 2, goodput.Limits{})
			if !ok || math.Abs(c.Goodput-tc.goodput2)/tc.goodput2 > 0.01 {
				t.Errorf("goodput at 2 workers = %v (ok %v), want %v", c.Goodput, ok, tc.goodput2)
			}
		})
	}
}
