package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/sampler"
)

func main() {
	// SIGINT stops at once; SIGTERM (under gorovod run) leaves the job
	// gracefully, see elastic.go.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fashion-mnist:", err)
		os.Exit(1)
	}
}

// options are the command-line settings.
type options struct {
	dataDir     string
	epochs      int
	batch       int
	lr          float64
	momentum    float64
	weightDecay float64
	hidden      int
	seed        uint64
	json        bool
	logEvery    int
	trainLimit  int
	evalBatch   int
	verbose     bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fashion-mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dataDir, "data-dir", mnist.DefaultDir, "directory with the Fashion-MNIST IDX .gz files (Debian package "+mnist.DebianPackage+")")
	fs.IntVar(&o.epochs, "epochs", 5, "data epochs to train")
	fs.IntVar(&o.batch, "batch-size", 64, "global batch size (split across ranks once training is distributed)")
	fs.Float64Var(&o.lr, "lr", 0.02, "learning rate")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum")
	fs.Float64Var(&o.weightDecay, "weight-decay", 0, "L2 weight decay")
	fs.IntVar(&o.hidden, "hidden", 128, "hidden relu units")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the weight initialization and the data shuffle")
	fs.BoolVar(&o.json, "json", false, "write one JSON object per step (and per epoch, and at the end) to stdout; progress lines go to stderr")
	fs.IntVar(&o.logEvery, "log-every", 100, "print a progress line every N steps (0: only per epoch)")
	fs.IntVar(&o.trainLimit, "train-limit", 0, "use only the first N training samples (0: all), for quick runs")
	fs.IntVar(&o.evalBatch, "eval-batch", 1000, "batch size of the test-set evaluation")
	fs.BoolVar(&o.verbose, "v", false, "log the elastic layer's decisions to stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.epochs < 1:
		return o, fmt.Errorf("--epochs %d < 1", o.epochs)
	case o.batch < 1:
		return o, fmt.Errorf("--batch-size %d < 1", o.batch)
	case o.hidden < 1:
		return o, fmt.Errorf("--hidden %d < 1", o.hidden)
	case o.logEvery < 0 || o.trainLimit < 0 || o.evalBatch < 1:
		return o, errors.New("--log-every and --train-limit must be ≥ 0, --eval-batch ≥ 1")
	}
	return o, nil
}

// stepRecord is the per-step JSON object.
type stepRecord struct {
	Kind         string  `json:"kind"` // "step"
	Step         int     `json:"step"`
	Epoch        uint64  `json:"epoch"`
	WorldEpoch   uint64  `json:"world_epoch"`
	Rank         int     `json:"rank"`
	Size         int     `json:"size"`
	Samples      int     `json:"samples"` // this rank's samples in the step
	Loss         float64 `json:"loss"`
	ParamsSHA256 string  `json:"params_sha256"`
}

// evalRecord reports a test-set evaluation after each data epoch ("epoch") and
// at the end ("final", which repeats the last epoch's figures with the whole
// training time). Epoch is the data epoch just finished, counted from 0.
type evalRecord struct {
	Kind         string  `json:"kind"`
	Step         int     `json:"step"`
	Epoch        uint64  `json:"epoch"`
	TrainLoss    float64 `json:"train_loss,omitempty"`
	TestLoss     float64 `json:"test_loss"`
	TestAccuracy float64 `json:"test_accuracy"`
	Seconds      float64 `json:"seconds"`
	ParamsSHA256 string  `json:"params_sha256"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// With --json, stdout carries only JSON so it can be piped to a parser.
	progress := stdout
	if o.json {
		progress = stderr
	}
	enc := json.NewEncoder(stdout)

	start := time.Now()
	train, test, err := mnist.Load(o.dataDir)
	if err != nil {
		return err
	}
	if o.trainLimit > 0 {
		train = train.Slice(0, o.trainLimit)
	}
	fmt.Fprintf(progress, "loaded %d training and %d test images of %d×%d from %s in %.2fs\n",
		train.N, test.N, train.Rows, train.Cols, o.dataDir, time.Since(start).Seconds())

	cfg := mnist.DefaultConfig()
	cfg.Inputs, cfg.Hidden, cfg.Seed = train.Features(), o.hidden, o.seed
	model, err := mnist.New(cfg)
	if err != nil {
		return err
	}
	opt := mnist.SGD{LR: float32(o.lr), Momentum: float32(o.momentum), WeightDecay: float32(o.weightDecay)}
	order, err := sampler.New(sampler.Config{N: train.N, Seed: o.seed, Shuffle: true})
	if err != nil {
		return err
	}
	// Everything a joining worker needs to continue exactly where the others are.
	state := gsync.NewState()
	state.RegisterTensor("params", model.Params())
	state.RegisterTensor("momentum", model.OptimizerState())
	state.RegisterBlob("sampler", order.MarshalBinary, order.UnmarshalBinary)
	w, err := joinWorld(ctx, state, o.verbose, stderr)
	if err != nil {
		return err
	}
	defer w.Close()
	w.SetTotalSteps(int64(o.epochs) * int64((train.N+o.batch-1)/o.batch))

	var (
		x          []float32
		y          []uint8
		step       int
		samples    int          // processed by this rank, for the throughput figure
		epochLoss  mnist.Result // this epoch's training loss so far
		windowLoss mnist.Result // since the last progress line
		last       mnist.Result // the latest test-set evaluation
		trainStart = time.Now()
		epochStart = trainStart
	)
	for order.Epoch() < uint64(o.epochs) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.CheckLeave(ctx); err != nil {
			return err
		}
		rank, size, worldEpoch := w.Rank(), w.Size(), w.WorldEpoch()
		st, err := order.Batch(rank, size, o.batch)
		if err != nil {
			return err
		}
		if st.Global == 0 { // the epoch is over
			if rank != 0 { // one report per job is enough
				order.NextEpoch()
				epochLoss, epochStart = mnist.Result{}, time.Now()
				continue
			}
			r, err := model.Evaluate(test, o.evalBatch)
			if err != nil {
				return err
			}
			last = r
			rec := evalRecord{
				Kind: "epoch", Step: step, Epoch: order.Epoch(), TrainLoss: epochLoss.Loss(),
				TestLoss: r.Loss(), TestAccuracy: r.Accuracy(), Seconds: time.Since(epochStart).Seconds(),
			}
			fmt.Fprintf(progress, "epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.2fs\n",
				rec.Epoch+1, o.epochs, rec.TrainLoss, rec.TestLoss, 100*rec.TestAccuracy, rec.Seconds)
			if o.json {
				rec.ParamsSHA256 = mnist.ParamsSHA256(model.Params())
				if err := enc.Encode(rec); err != nil {
					return err
				}
			}
			order.NextEpoch()
			epochLoss, epochStart = mnist.Result{}, time.Now()
			continue
		}
		if x, y, err = train.Gather(st.Indices, x, y); err != nil {
			return err
		}
		// Scale by size/Global rather than by the local batch: the allreduce
		// averages, so this gives the exact mean over the global batch even
		// when the ranks' shares differ in size.
		r, err := model.ComputeGradients(x, y, float32(size)/float32(st.Global))
		if err != nil {
			return err
		}
		w.RecordSamples(len(st.Indices))
		err = w.Allreduce(ctx, [][]float32{model.Grads()})
		if errors.Is(err, gsync.ErrWorldChanged) {
			continue // the state was re-synchronized; redo the step from it
		}
		if err != nil {
			return err
		}
		model.Update(opt)
		// Only a committed step advances the order.
		if err := order.Advance(st.Global); err != nil {
			return err
		}
		left := false
		switch err := w.Commit(ctx); {
		case errors.Is(err, gsync.ErrWorldChanged):
			continue // carry on from the new rank 0's state
		case errors.Is(err, gsync.ErrExcluded):
			left = true // this step counted; then leave
		case err != nil:
			return err
		}
		step = int(w.Step())
		samples += r.N
		for _, acc := range []*mnist.Result{&epochLoss, &windowLoss} {
			acc.LossSum += r.LossSum
			acc.Correct += r.Correct
			acc.N += r.N
		}
		if o.json {
			if err := enc.Encode(stepRecord{
				Kind: "step", Step: step, Epoch: st.Epoch, WorldEpoch: worldEpoch, Rank: rank, Size: size,
				Samples: r.N, Loss: r.Loss(), ParamsSHA256: mnist.ParamsSHA256(model.Params()),
			}); err != nil {
				return err
			}
		}
		if left {
			fmt.Fprintf(progress, "left the job at step %d\n", step)
			return nil
		}
		if o.logEvery > 0 && step%o.logEvery == 0 {
			el := time.Since(trainStart).Seconds()
			fmt.Fprintf(progress, "epoch %d step %d (%d/%d): loss %.4f, train accuracy %.2f%%, %.0f samples/s\n",
				st.Epoch+1, step, order.Processed(), train.N, windowLoss.Loss(), 100*windowLoss.Accuracy(),
				float64(samples)/el)
			windowLoss = mnist.Result{}
		}
	}

	// The loop ends right after the last epoch's evaluation, so that is the
	// final result; no need to evaluate the same parameters again.
	trainSeconds := time.Since(trainStart).Seconds()
	_ = w.Finish(ctx)
	if w.Rank() != 0 {
		return nil
	}
	sum := mnist.ParamsSHA256(model.Params())
	fmt.Fprintf(progress, "final: test accuracy %.2f%% (loss %.4f) after %d epochs, %d steps; training %.1fs, total %.1fs; params_sha256 %s\n",
		100*last.Accuracy(), last.Loss(), o.epochs, step, trainSeconds, time.Since(start).Seconds(), sum)
	if o.json {
		return enc.Encode(evalRecord{
			Kind: "final", Step: step, Epoch: uint64(o.epochs - 1), TestLoss: last.Loss(), TestAccuracy: last.Accuracy(),
			Seconds: trainSeconds, ParamsSHA256: sum,
		})
	}
	return nil
}
