package heuristics

import (
	"errors"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// ErrNotMeasured is returned by FitGoodput while the history holds no steady
// step with samples and times to fit to.
var ErrNotMeasured = errors.New("heuristics: no step with samples and times measured yet")

// FitGoodput fits a job's goodput model to its history, as the goodput
// heuristic does, for a caller that schedules many jobs (package pool): M0 is
// initBatch (0: the first reported step's global batch), the throughput model
// is fitted to every steady step of every world so far, with
// workersPerNode workers to a machine, and the gradient statistics are the
// newest reported. A job whose trainer reports no gradient statistics gets
// zero ones (Model.Grad.Var == 0): statistical efficiency 1 at every batch
// size, its goodput its throughput. The profile says which configurations
// were measured (Profile.MaxReplicas bounds Pollux's exploration). A base
// profile (nil: none) is what the job was measured at before this history
// began (its earlier driver's, as its status recorded it): the fit counts
// its steps with the history's, and base itself is not changed.
func FitGoodput(h *History, base *goodput.Profile, initBatch, workersPerNode int) (goodput.Model, *goodput.Profile, error) {
	g := goodputHeuristic{cfg: goodputConfig{InitBatch: initBatch, WorkersPerNode: max(workersPerNode, 1)}}
	m := goodput.Model{InitBatch: initBatch}
	if m.InitBatch <= 0 {
		if m.InitBatch = firstBatch(h); m.InitBatch == 0 {
			return m, nil, ErrNotMeasured
		}
	}
	m.Grad, _ = newestGradStats(h)
	prof := base.Clone()
	for _, p := range h.Periods {
		k := p.Workers()
		for _, s := range p.Steady() {
			if o, ok := g.observation(k, s); ok {
				_ = prof.Add(o) // observation only returns valid ones
			}
		}
	}
	if prof.Len() == 0 {
		return m, prof, ErrNotMeasured
	}
	var err error
	if m.Perf, err = prof.Fit(); err != nil {
		return m, prof, err
	}
	return m, prof, nil
}
