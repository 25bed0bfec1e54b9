package sync

import "context"

// UseAdaptiveBatch makes a decide the batch size through this session's
// gradient allreduces — what Train does for a TrainConfig with an
// AdaptiveBatch, for trainers that drive a Session themselves (the language
// bindings' engine): the gradient noise measurement is turned on (M0 =
// a's InitBatch) if it is off, and rank 0's decisions travel beside the
// gradients and are adopted at Commit. Run a's background work with
// a.Run. Each step the trainer runs the plan of a.PlanBatch, calls
// SetGlobalBatch with its global batch, and, when the plan accumulates
// (Accum > 0), records each micro-batch's gradient (RecordMicroBatch or
// RecordMicroBatchNorm) before reducing their mean.
//
// Every worker must call it at the same point of its sequence of
// collectives, between steps, from the goroutine that drives the session,
// with no asynchronous allreduce in flight. The measurement's and the
// policy's state are not added to the job's state here: every worker's
// estimate is the same (it comes from the same reduced norms), but a worker
// joining later starts from M0 until rank 0's next decision reaches it.
func (s *Session) UseAdaptiveBatch(a *AdaptiveBatch) error {
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

// RecordMicroBatchNorm is RecordMicroBatch for a trainer that takes the
// squared norm itself: sq is Σ‖g‖² of one micro-batch's mean gradient over
// all its tensors. One that is not a finite number ≥ 0 leaves the step
// unmeasured. Without the measurement it does nothing.
func (s *Session) RecordMicroBatchNorm(sq float64) {
	if s.noise != nil {
		s.noise.recordMicroBatchNorm(sq)
	}
}

// Run does the policy's background work (refitting the throughput model,
// reconsidering the batch size) until ctx ends, for a policy given to
// Session.UseAdaptiveBatch (Train runs it itself).
func (a *AdaptiveBatch) Run(ctx context.Context) { a.run(ctx) }
