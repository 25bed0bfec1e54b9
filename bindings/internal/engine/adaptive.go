package engine

import (
	"context"
	"fmt"

	gsync "github.com/gorovod/gorovod/sync"
)

// The adaptive batch size for a framework's own training loop (the Python
// binding's gorovod.torch.AdaptiveDataLoader): the engine runs a
// sync.AdaptiveBatch on its session, the framework asks it for each step's
// plan and says which global batch the step ran.

// StartAdaptive turns the adaptive batch size on (see
// sync.Session.UseAdaptiveBatch): cfg is the policy's configuration. Every
// rank must call it at the same point of its sequence of collectives,
// before the first step that uses it. It waits for the collectives
// submitted before it. A second call is refused.
func (e *Engine) StartAdaptive(cfg gsync.AdaptiveConfig) error {
	cfg.Logger = e.log
	a, err := gsync.NewAdaptiveBatch(cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !e.adaptive.CompareAndSwap(nil, a) {
		return fmt.Errorf("%w: the adaptive batch size is already on", ErrInvalid)
	}
	h, err := e.submit(&call{what: "start of the adaptive batch size", run: func(_ context.Context, s *gsync.Session) error {
		return s.UseAdaptiveBatch(a)
	}})
	if err == nil {
		err = e.Wait(h, -1)
	}
	if err != nil {
		e.adaptive.Store(nil)
		return err
	}
	go a.Run(e.ctx)
	return nil
}

// AdaptivePlan is the plan in force for the next step on the current world:
// the global batch, this rank's micro-batch, the accumulation steps and the
// learning-rate factor (see sync.BatchPlan). Every rank gets the same plan between the same two
// commits.
func (e *Engine) AdaptivePlan() (gsync.BatchPlan, error) {
	a := e.adaptive.Load()
	if a == nil {
		return gsync.BatchPlan{}, fmt.Errorf("%w: the adaptive batch size is not on (StartAdaptive)", ErrInvalid)
	}
	return a.PlanBatch(gsync.Progress{Size: e.Topology().Size}), nil
}

// SetGlobalBatch tells the gradient noise measurement the current step's
// global batch (sync.Session.SetGlobalBatch), in order with the step's
// collectives: call it after the previous step's Commit and before this
// step's gradients are reduced. It waits for the collectives before it.
func (e *Engine) SetGlobalBatch(n int) error {
	if n < 1 {
		return fmt.Errorf("%w: a global batch of %d", ErrInvalid, n)
	}
	h, err := e.submit(&call{what: "global batch", run: func(_ context.Context, s *gsync.Session) error {
		s.SetGlobalBatch(n)
		return nil
	}})
	if err != nil {
		return err
	}
	return e.Wait(h, -1)
}

// RecordMicroBatchNorm records the squared norm of one micro-batch's mean
// gradient when the step accumulates (sync.Session.RecordMicroBatchNorm),
// in order with the step's collectives: before the step's gradients are
// reduced. It waits for the collectives before it.
func (e *Engine) RecordMicroBatchNorm(sq float64) error {
	h, err := e.submit(&call{what: "micro-batch norm", run: func(_ context.Context, s *gsync.Session) error {
		s.RecordMicroBatchNorm(sq)
		return nil
	}})
	if err != nil {
		return err
	}
	return e.Wait(h, -1)
}
