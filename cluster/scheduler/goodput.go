package scheduler

import (
	"math"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// ModelGoodput is Job.Goodput for a job described by a goodput model: its
// predicted goodput at the best batch size within lim for each allocation (0
// where no batch size is feasible). The model is copied: refit and call
// again for the next round.
func ModelGoodput(m goodput.Model, lim goodput.Limits) func(nodes, replicas int) float64 {
	return func(nodes, replicas int) float64 {
		c, ok := m.Optimize(nodes, replicas, lim)
		if !ok {
			return 0
		}
		return c.Goodput
	}
}

// ModelStepTime is Job.StepTime for a job described by a goodput model: the
// time of a step of the model's initial batch on r replicas, perNode to a
// node (+Inf where the model predicts no throughput).
func ModelStepTime(m goodput.Model, perNode int) func(r int) float64 {
	perNode = max(perNode, 1)
	return func(r int) float64 {
		r = max(r, 1)
		micro := (m.InitBatch + r - 1) / r
		tp := m.Throughput((r+perNode-1)/perNode, r, micro, 0)
		if !(tp > 0) {
			return math.Inf(1)
		}
		return float64(m.InitBatch) / tp
	}
}
