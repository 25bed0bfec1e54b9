package sync_test

import (
	"context"
	"fmt"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/sampler"
)

// Train owns the elastic loop: the trainer writes one step. Run alone, as
// here, it trains in a world of one; started by `gorovod run` the same
// program joins the job, and the loop redoes a step the world changed under,
// leaves gracefully on SIGTERM and hands the sampler's position to joiners.
//
// The model fits y = 3x by gradient descent on the mean squared error; the
// gradient travels as float16, halving the bytes an allreduce moves.
func ExampleTrain() {
	xs := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	w := []float32{0} // the parameter
	state := gsync.NewState()
	state.RegisterTensor("w", w) // what a joining worker receives

	data, err := sampler.New(sampler.Config{N: len(xs), Seed: 1, Shuffle: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	grad := make([]collective.F16, 1)
	var loss float32
	cfg := gsync.TrainConfig{
		Data:        data,
		Epochs:      3,
		GlobalBatch: 4,
		EpochEnd: func(ctx context.Context, e gsync.EpochEnd) error {
			fmt.Printf("data epoch %d done at step %d: w = %.3f, last loss %.3f\n", e.Epoch, e.Step, w[0], loss)
			return nil
		},
	}
	res, err := gsync.Train(context.Background(), cfg, state, func(ctx context.Context, s *gsync.TrainStep) error {
		// This worker's share of the batch: the mean gradient over the
		// global batch is the sum over the workers of their shares' sums
		// divided by Global.
		var g float32
		loss = 0
		for _, i := range s.Batch.Indices {
			diff := w[0]*xs[i] - 3*xs[i]
			g += 2 * diff * xs[i] / float32(s.Batch.Global)
			loss += diff * diff / float32(s.Batch.Global)
		}
		grad[0] = collective.NewF16(g)
		if err := s.Session.Allreduce(ctx, gsync.Sum(), collective.SliceBuffer(grad)); err != nil {
			return err // ErrWorldChanged: the loop redoes the step
		}
		w[0] -= 0.01 * grad[0].Float32()
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%v after %d steps in a world of %d: w = %.2f\n", res.Outcome, res.Steps, res.Size, w[0])
	// Output:
	// data epoch 0 done at step 2: w = 2.323, last loss 24.026
	// data epoch 1 done at step 4: w = 2.883, last loss 0.303
	// data epoch 2 done at step 6: w = 2.974, last loss 0.156
	// completed after 6 steps in a world of 1: w = 2.97
}
