package sync

import (
	"context"
	"fmt"
)

// The loop's part of the gradient noise measurement and of policies that
// decide through it (AdaptiveBatch).

// backgrounder is a batch policy with work of its own beside training.
type backgrounder interface{ run(ctx context.Context) }

// stateful is a batch policy whose decisions are part of the job's state.
type stateful interface {
	marshal() ([]byte, error)
	unmarshal([]byte) error
}

// prepareNoise turns the gradient noise measurement on (unless
// NoGradientNoise), with M0 the adaptive policy's initial batch or the fixed
// batch, and registers an adaptive policy's plan in the state.
func (c *TrainConfig) prepareNoise(state *State) error {
	_, adaptive := c.BatchPolicy.(decider)
	if adaptive && c.NoGradientNoise {
		return fmt.Errorf("%w: the adaptive batch size needs the gradient noise measurement (NoGradientNoise is set)", ErrInvalidConfig)
	}
	if s, ok := c.BatchPolicy.(stateful); ok {
		state.replaceBlob(adaptiveBlob, s.marshal, s.unmarshal)
	}
	if c.NoGradientNoise {
		return nil
	}
	n := &c.Worker.Session.GradientNoise
	n.Measure = true
	switch p := c.BatchPolicy.(type) {
	case *AdaptiveBatch:
		n.InitBatch = p.cfg.InitBatch
	case FixedBatch:
		if n.InitBatch == 0 {
			n.InitBatch = int(p)
		}
	}
	return nil
}

// attachPolicy connects a deciding policy to a session's measurement: the
// loop's first session, and each one a rejoin gives it.
func attachPolicy(cfg TrainConfig, sess *Session) error {
	d, ok := cfg.BatchPolicy.(decider)
	if !ok {
		return nil
	}
	if sess.noise == nil {
		return fmt.Errorf("%w: the adaptive batch size needs the session's gradient noise measurement (Config.GradientNoise)", ErrInvalidConfig)
	}
	sess.noise.setDecider(d)
	return nil
}

// detachPolicy undoes attachPolicy.
func detachPolicy(cfg TrainConfig, sess *Session) {
	if _, ok := cfg.BatchPolicy.(decider); ok && sess.noise != nil {
		sess.noise.setDecider(nil)
	}
}

// startPolicy starts a deciding policy's background work; stop ends it.
func startPolicy(ctx context.Context, cfg TrainConfig) (stop func()) {
	b, ok := cfg.BatchPolicy.(backgrounder)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
