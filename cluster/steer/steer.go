package steer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// Config configures a Steer. A zero field means its default.
type Config struct {
	// Target is the first world size asked for (0: none yet, hold).
	Target int
	// InitBatch is the job's initial global batch size, for the model (0:
	// the trainer's own, as measured).
	InitBatch int
	// WorkersPerNode is the packing the model is fitted for (0: all on one
	// machine).
	WorkersPerNode int
	// FitEvery: the model is not refitted more often. Default 1 s.
	FitEvery time.Duration
	// GrowOnly: the heuristic never shrinks the world. For an allocator that
	// shrinks the job by taking hosts away (a job.Discovery dropping them),
	// so that the workers that go are those on the hosts that went, not the
	// engine's choice (the newest).
	GrowOnly bool
	// Allocator names who sets the target, in the decisions' reasons.
	// Default "the allocator".
	Allocator string
	// Recorded is what the job's earlier driver measured (nil: nothing, the
	// job is new). A driver that takes a running job over fits to it with
	// what it measures itself, so the allocator does not see the job as new.
	Recorded *Recorded
}

// Recorded is a job's goodput model and profile as an earlier driver of it
// last recorded them.
type Recorded struct {
	// Model gives M0, where Config.InitBatch is 0, and the gradient
	// statistics until the trainer reports newer ones.
	Model goodput.Model
	// Profile is the configurations measured, with their sums.
	Profile *goodput.Profile
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{FitEvery: time.Second, Allocator: "the allocator"} }

// Fitted is what is known of a job's goodput model.
type Fitted struct {
	OK          bool // Model is fitted to at least one configuration
	Model       goodput.Model
	MaxProfiled int       // the largest world size measured
	Grad        bool      // the trainer reports gradient statistics
	Why         string    // why there is no model yet
	At          time.Time // when it was fitted
	// Profile is the configurations measured, the recorded ones included,
	// for the job's next driver (Config.Recorded).
	Profile []goodput.ProfileEntry
}

// Steer is the heuristic (heuristics.Heuristic, heuristics.Background).
type Steer struct {
	cfg Config

	mu      sync.Mutex
	target  int
	ready   func()
	fit     Fitted
	lastFit time.Time
}

// New returns a Steer aiming at cfg.Target.
func New(cfg Config) *Steer {
	def := DefaultConfig()
	if cfg.FitEvery <= 0 {
		cfg.FitEvery = def.FitEvery
	}
	if cfg.Allocator == "" {
		cfg.Allocator = def.Allocator
	}
	return &Steer{cfg: cfg, target: max(cfg.Target, 0), fit: Fitted{Why: "measuring"}}
}

// Name implements heuristics.Heuristic.
func (*Steer) Name() string { return "steer" }

// OnReady implements heuristics.Background: a new target is an answer the
// engine collects at once, without waiting for the next step.
func (s *Steer) OnReady(ready func()) {
	s.mu.Lock()
	s.ready = ready
	s.mu.Unlock()
}

// SetTarget asks for a world of n workers.
func (s *Steer) SetTarget(n int) {
	s.mu.Lock()
	changed := s.target != n
	s.target = n
	ready := s.ready
	s.mu.Unlock()
	if changed && ready != nil {
		ready()
	}
}

// Target is the world size asked for.
func (s *Steer) Target() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

// Model is the job's goodput model as last fitted.
func (s *Steer) Model() Fitted {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fit
}

// Decide implements heuristics.Heuristic.
func (s *Steer) Decide(_ context.Context, h *heuristics.History) (heuristics.Decision, error) {
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
			Reason: fmt.Sprintf("%s allocates %d workers", s.cfg.Allocator, target)}, nil
	case target < k && !s.cfg.GrowOnly:
		return heuristics.Decision{Action: heuristics.Shrink, Count: k - target,
			Reason: fmt.Sprintf("%s allocates %d workers", s.cfg.Allocator, target)}, nil
	case target < k:
		return heuristics.HoldBecause("%d workers, %s allocates %d: the others leave with their hosts", k, s.cfg.Allocator, target), nil
	}
	return heuristics.HoldBecause("at %s's allocation, %d workers", s.cfg.Allocator, k), nil
}

// refit fits the goodput model to the history, at most every FitEvery.
func (s *Steer) refit(h *heuristics.History) {
	s.mu.Lock()
	due := time.Since(s.lastFit) >= s.cfg.FitEvery
	if due {
		s.lastFit = time.Now()
	}
	s.mu.Unlock()
	if !due {
		return
	}
	initBatch, base, r := s.cfg.InitBatch, (*goodput.Profile)(nil), s.cfg.Recorded
	if r != nil {
		base = r.Profile
		if initBatch <= 0 {
			initBatch = r.Model.InitBatch
		}
	}
	m, prof, err := heuristics.FitGoodput(h, base, initBatch, s.cfg.WorkersPerNode)
	if r != nil && m.Grad == (goodput.GradParams{}) {
		m.Grad = r.Model.Grad
	}
	f := Fitted{Model: m, Grad: m.Grad.Var > 0, At: time.Now()}
	if prof != nil {
		f.MaxProfiled = prof.MaxReplicas()
		f.Profile = prof.Entries()
	}
	switch {
	case errors.Is(err, heuristics.ErrNotMeasured):
		f.Why = "measuring"
	case err != nil:
		f.Why = err.Error()
	default:
		f.OK = true
	}
	s.mu.Lock()
	s.fit = f
	s.mu.Unlock()
}
