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

// startPolicy connects a deciding policy to the session's measurement and
// starts its background work; stop ends it.
func startPolicy(ctx context.Context, cfg TrainConfig, sess *Session) (stop func(), err error) {
	d, ok := cfg.BatchPolicy.(decider)
	if !ok {
		return func() {}, nil
	}
	if sess.noise == nil {
		return nil, fmt.Errorf("%w: the adaptive batch size needs the session's gradient noise measurement (Config.GradientNoise)", ErrInvalidConfig)
	}
	sess.noise.setDecider(d)
	b, ok := d.(backgrounder)
	if !ok {
		return func() {}, nil
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
		sess.noise.setDecider(nil)
	}, nil
}
