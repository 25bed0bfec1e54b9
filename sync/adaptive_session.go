package sync

import (
	"context"
	"fmt"
)

// UseAdaptiveBatch makes a decide the batch size through this session's
// gradient allreduces — what Train does for a TrainConfig with an
// AdaptiveBatch, for trainers that drive a Session themselves (the language
// bindings' engine): the gradient noise measurement is turned on (M0 =
// a's InitBatch) if it is off, and rank 0's decisions travel beside the
// gradients and are adopted at Commit. Run a's background work with
// a.Run. The trainer calls SetGlobalBatch each step with the plan's global
// batch (PlanBatch), and must not accumulate gradients over micro-batches
// (a's config sets NoAccumulation; Train is the loop that accumulates).
//
// Every worker must call it at the same point of its sequence of
// collectives, between steps, from the goroutine that drives the session,
// with no asynchronous allreduce in flight. The measurement's and the
// policy's state are not added to the job's state here: every worker's
// estimate is the same (it comes from the same reduced norms), but a worker
// joining later starts from M0 until rank 0's next decision reaches it.
func (s *Session) UseAdaptiveBatch(a *AdaptiveBatch) error {
	if !a.cfg.NoAccumulation {
		return fmt.Errorf("%w: a Session driven by its trainer does not accumulate gradients: set AdaptiveConfig.NoAccumulation", ErrInvalidConfig)
	}
	if s.noise == nil {
		n, err := newGradNoise(NoiseConfig{Measure: true, InitBatch: a.cfg.InitBatch})
		if err != nil {
			return err
		}
		s.noise = n
	}
	s.noise.setDecider(a)
	return nil
}

// Run does the policy's background work (refitting the throughput model,
// reconsidering the batch size) until ctx ends, for a policy given to
// Session.UseAdaptiveBatch (Train runs it itself).
func (a *AdaptiveBatch) Run(ctx context.Context) { a.run(ctx) }
