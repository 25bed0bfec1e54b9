package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// steer is the heuristic the pool gives each job's autoscaling engine: it
// moves the job's world to the size the pool allocated (its target) and, on
// the engine's goroutine where the history lives, fits the job's goodput
// model for the pool's next round.
type steer struct {
	initBatch int
	perNode   int           // workers to a machine, for the model
	fitEvery  time.Duration // the fit is not redone more often than this

	mu      sync.Mutex
	target  int
	ready   func()
	fit     fitted
	lastFit time.Time
}

// fitted is what the pool knows of a job's goodput model.
type fitted struct {
	ok          bool // model is fitted to at least one configuration
	model       goodput.Model
	maxProfiled int    // the largest world size measured
	grad        bool   // the trainer reports gradient statistics
	why         string // why there is no model yet
}

func (*steer) Name() string { return "pool" }

// OnReady implements heuristics.Background: a new target is an answer the
// engine collects at once, without waiting for the next step.
func (s *steer) OnReady(ready func()) {
	s.mu.Lock()
	s.ready = ready
	s.mu.Unlock()
}

// setTarget asks for a world of n workers.
func (s *steer) setTarget(n int) {
	s.mu.Lock()
	changed := s.target != n
	s.target = n
	ready := s.ready
	s.mu.Unlock()
	if changed && ready != nil {
		ready()
	}
}

func (s *steer) model() fitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fit
}

func (s *steer) Decide(_ context.Context, h *heuristics.History) (heuristics.Decision, error) {
	s.refit(h)
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	k := h.Workers()
	switch {
	case k == 0 || target == 0:
		return heuristics.HoldBecause("no world yet"), nil
	case target > k:
		return heuristics.Decision{Action: heuristics.Grow, Count: target - k,
			Reason: fmt.Sprintf("the pool allocates %d slots", target)}, nil
	case target < k:
		return heuristics.Decision{Action: heuristics.Shrink, Count: k - target,
			Reason: fmt.Sprintf("the pool allocates %d slots", target)}, nil
	}
	return heuristics.HoldBecause("at the pool's allocation, %d workers", k), nil
}

// refit fits the goodput model to the history, at most every fitEvery.
func (s *steer) refit(h *heuristics.History) {
	if time.Since(s.lastFit) < s.fitEvery {
		return
	}
	s.lastFit = time.Now()
	m, prof, err := heuristics.FitGoodput(h, s.initBatch, s.perNode)
	f := fitted{model: m, grad: m.Grad.Var > 0}
	if prof != nil {
		f.maxProfiled = prof.MaxReplicas()
	}
	switch {
	case errors.Is(err, heuristics.ErrNotMeasured):
		f.why = "measuring"
	case err != nil:
		f.why = err.Error()
	default:
		f.ok = true
	}
	s.mu.Lock()
	s.fit = f
	s.mu.Unlock()
}
