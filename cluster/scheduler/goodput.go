package scheduler

import "github.com/gorovod/gorovod/heuristics/goodput"

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
