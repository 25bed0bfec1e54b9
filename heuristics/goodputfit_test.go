package heuristics

import (
	"errors"
	"math"
	"testing"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// FitGoodput fits the same model the goodput heuristic decides with (the
// hand-computed job of goodput_test.go), takes the gradient statistics when
// the trainer reports them and assumes efficiency 1 when it does not.
func TestFitGoodput(t *testing.T) {
	noGrad := func(m measured) measured { m.v, m.sqr = 0, 0; return m }
	for _, tc := range []struct {
		name      string
		h         *History
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, prof, err := FitGoodput(tc.h, tc.initBatch, 1)
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
