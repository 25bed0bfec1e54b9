package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/sampler"
)

func main() {
	// SIGINT stops at once; SIGTERM (under gorovod run) leaves the job
	// gracefully (sync.Train sees to it).
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
	gradDType   string
	// pauseAtEnd: the last world's rank 0 pauses itself (SIGSTOP) once
	// it has reported the end of training (a fault for the tests).
	pauseAtEnd bool
	// dieAtEnd: a file; the last world's rank 0 that finds it missing
	// creates it and kills itself (SIGKILL) instead of writing its final
	// line (a fault for the tests: one rank 0 dies, its successor writes).
	dieAtEnd string
	batchOptions
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fashion-mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dataDir, "data-dir", mnist.DefaultDir, "directory with the Fashion-MNIST IDX .gz files (Debian package "+mnist.DebianPackage+"; without it in the default directory, a generated stand-in, said loudly)")
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
	fs.StringVar(&o.gradDType, "grad-dtype", "float32", "dtype the gradients are averaged in across workers: float32, or float16 or bfloat16 for half the bytes (the parameters stay float32)")
	fs.BoolVar(&o.pauseAtEnd, "pause-at-end", false, "the last world's rank 0 pauses itself (SIGSTOP) once it has reported the end of training: a worker paused at the end of a job, which gorovod run wakes (SIGCONT) to let it exit (tests)")
	fs.StringVar(&o.dieAtEnd, "die-at-end", "", "a file: the last world's rank 0 that finds it missing creates it and kills itself (SIGKILL) instead of writing its final line, as a worker killed right after the last step; the new world's rank 0 writes the line (tests)")
	o.batchOptions.register(fs)
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
	case o.gradDType != "float32" && o.gradDType != "float16" && o.gradDType != "bfloat16":
		return o, fmt.Errorf("--grad-dtype %q: want float32, float16 or bfloat16", o.gradDType)
	}
	return o, o.batchOptions.check(o.batch)
}

// stepRecord is the per-step JSON object.
type stepRecord struct {
	Kind       string `json:"kind"` // "step"
	Step       int    `json:"step"`
	Epoch      uint64 `json:"epoch"`
	WorldEpoch uint64 `json:"world_epoch"`
	// WorldRank0 is the member name of the world's rank 0: with WorldEpoch
	// it names the world the step ran in (workers cut off from each other
	// may number their worlds alike, and each trains on apart until they
	// meet again and take one of their states).
	WorldRank0   string  `json:"world_rank0"`
	Rank         int     `json:"rank"`
	Size         int     `json:"size"`
	Samples      int     `json:"samples"` // this rank's samples in the step
	Loss         float64 `json:"loss"`
	ParamsSHA256 string  `json:"params_sha256"`
	// The batch plan and the gradient statistics (goodput): the global
	// batch, the micro-batches accumulated beyond the first, the
	// learning-rate factor, and the statistical efficiency of the batch
	// relative to M0 with the smoothed gradient square and variance it
	// comes from (absent before the first estimate).
	Global int `json:"global_batch"`
	// Start is where the global batch begins in the data epoch's order:
	// the steps of an epoch tile it, each sample once.
	Start      int      `json:"start"`
	Accum      int      `json:"accum,omitempty"`
	LRFactor   float64  `json:"lr_factor"`
	Efficiency *float64 `json:"efficiency,omitempty"`
	GradSqr    *float64 `json:"grad_sqr,omitempty"`
	GradVar    *float64 `json:"grad_var,omitempty"`
	// TrainedSamples counts the job's samples so far (data epochs ×
	// training set + this epoch's), Seconds this worker's training time
	// without the test-set evaluations.
	TrainedSamples int     `json:"trained_samples"`
	Seconds        float64 `json:"seconds"`
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
	// For "eval" records (--eval-every-samples): the job's samples so far
	// and the training time without evaluations.
	TrainedSamples int     `json:"trained_samples,omitempty"`
	TrainSeconds   float64 `json:"train_seconds,omitempty"`
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
	// Without Debian's package in the default directory, a generated stand-in
	// (said loudly: its accuracy is not Fashion-MNIST's); a --data-dir that
	// lacks the files is an error.
	train, test, src, err := mnist.LoadOrGenerate(o.dataDir, mnist.DefaultGenerateConfig())
	if err != nil {
		return err
	}
	if w := src.Warning(); w != "" {
		fmt.Fprintln(stderr, w)
	}
	if o.trainLimit > 0 {
		train = train.Slice(0, o.trainLimit)
	}
	fmt.Fprintf(progress, "loaded %d training and %d test images of %d×%d from %s in %.2fs\n",
		train.N, test.N, train.Rows, train.Cols, src, time.Since(start).Seconds())

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
	// Everything a joining worker needs to continue exactly where the others
	// are (the loop adds the sampler's position).
	state := gsync.NewState()
	state.RegisterTensor("params", model.Params())
	state.RegisterTensor("momentum", model.OptimizerState())
	reduce := newGradReducer(o.gradDType, model.Grads())

	var (
		x          []float32
		y          []uint8
		current    mnist.Result // the step being trained
		ranIn      string       // the member name of the rank 0 of the world it ran in
		samples    int          // processed by this rank, for the throughput figure
		epochLoss  mnist.Result // this epoch's training loss so far
		windowLoss mnist.Result // since the last progress line
		last       mnist.Result // the latest test-set evaluation
		lastEpoch  = -1         // the data epoch it evaluated (-1: none)
		trainStart = time.Now()
		epochStart = trainStart
	)
	loop := gsync.TrainConfig{Data: order, Epochs: uint64(o.epochs)}
	var verbose *slog.Logger
	if o.verbose {
		verbose = slog.New(slog.NewTextHandler(stderr, nil))
		loop.Worker.Logger = verbose
	}
	if err := o.batchOptions.configure(&loop, o.batch, verbose); err != nil {
		return err
	}
	micro := &microBatchTrainer{model: model, train: train}
	evals := &evaluator{every: o.evalEvery}
	loop.Committed = func(ctx context.Context, s *gsync.TrainStep) error {
		r := current
		samples += r.N
		for _, acc := range []*mnist.Result{&epochLoss, &windowLoss} {
			acc.LossSum += r.LossSum
			acc.Correct += r.Correct
			acc.N += r.N
		}
		trained := int(order.Epoch())*train.N + order.Processed()
		seconds := time.Since(trainStart).Seconds() - evals.evalDur
		if o.json {
			rec := stepRecord{
				Kind: "step", Step: int(s.Number), Epoch: s.Batch.Epoch, WorldEpoch: s.World, WorldRank0: ranIn, Rank: s.Rank, Size: s.Size,
				Samples: r.N, Loss: r.Loss(), ParamsSHA256: mnist.ParamsSHA256(model.Params()),
				Global: s.Batch.Global, Start: s.Batch.Start, Accum: s.Plan.Accum, LRFactor: o.lrFactor(s), TrainedSamples: trained, Seconds: seconds,
			}
			if eff, sqr, v := o.efficiency(s); !math.IsNaN(eff) {
				rec.Efficiency, rec.GradSqr, rec.GradVar = &eff, &sqr, &v
			}
			if err := enc.Encode(rec); err != nil {
				return err
			}
		}
		if s.Rank == 0 && evals.due(trained) {
			began := time.Now()
			r, err := model.Evaluate(test, o.evalBatch)
			if err != nil {
				return err
			}
			evals.evalDur += time.Since(began).Seconds()
			fmt.Fprintf(progress, "%d samples, %.1fs: test accuracy %.2f%%\n", trained, seconds, 100*r.Accuracy())
			if o.json {
				if err := enc.Encode(evalRecord{Kind: "eval", Step: int(s.Number), Epoch: s.Batch.Epoch, TestLoss: r.Loss(),
					TestAccuracy: r.Accuracy(), TrainedSamples: trained, TrainSeconds: seconds}); err != nil {
					return err
				}
			}
		}
		if o.logEvery > 0 && s.Number%int64(o.logEvery) == 0 {
			fmt.Fprintf(progress, "epoch %d step %d (%d/%d): loss %.4f, train accuracy %.2f%%, %.0f samples/s on this worker\n",
				s.Batch.Epoch+1, s.Number, order.Processed(), train.N, windowLoss.Loss(), 100*windowLoss.Accuracy(),
				float64(samples)/time.Since(trainStart).Seconds())
			windowLoss = mnist.Result{}
		}
		return nil
	}
	// Rank 0 evaluates each data epoch, once for the job.
	loop.EpochEnd = func(ctx context.Context, e gsync.EpochEnd) error {
		r, err := model.Evaluate(test, o.evalBatch)
		if err != nil {
			return err
		}
		last, lastEpoch = r, int(e.Epoch)
		rec := evalRecord{
			Kind: "epoch", Step: int(e.Step), Epoch: e.Epoch, TrainLoss: epochLoss.Loss(),
			TestLoss: r.Loss(), TestAccuracy: r.Accuracy(), Seconds: time.Since(epochStart).Seconds(),
		}
		fmt.Fprintf(progress, "epoch %d/%d done: train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.2fs\n",
			rec.Epoch+1, o.epochs, rec.TrainLoss, rec.TestLoss, 100*rec.TestAccuracy, rec.Seconds)
		epochLoss, epochStart = mnist.Result{}, time.Now()
		if !o.json {
			return nil
		}
		rec.ParamsSHA256 = mnist.ParamsSHA256(model.Params())
		return enc.Encode(rec)
	}
	// The job's result, written by the last world's rank 0 before the end
	// is reported: if it dies first, the new world's rank 0 writes it.
	loop.Final = func(ctx context.Context, res gsync.TrainResult) error {
		trainSeconds := time.Since(trainStart).Seconds()
		if lastEpoch != o.epochs-1 {
			// The rank 0 that evaluated the last epoch died: the same
			// parameters, evaluated again here.
			r, err := model.Evaluate(test, o.evalBatch)
			if err != nil {
				return err
			}
			last, lastEpoch = r, o.epochs-1
		}
		if o.dieAtEnd != "" {
			if f, err := os.OpenFile(o.dieAtEnd, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
				f.Close()
				return syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
		sum := mnist.ParamsSHA256(model.Params())
		if d := describeAdaptive(loop.BatchPolicy); d != "" {
			fmt.Fprintln(progress, d)
		}
		fmt.Fprintf(progress, "final: test accuracy %.2f%% (loss %.4f) after %d epochs, %d steps; training %.1fs, total %.1fs; params_sha256 %s\n",
			100*last.Accuracy(), last.Loss(), o.epochs, res.Steps, trainSeconds, time.Since(start).Seconds(), sum)
		if !o.json {
			return nil
		}
		return enc.Encode(evalRecord{
			Kind: "final", Step: int(res.Steps), Epoch: uint64(o.epochs - 1), TestLoss: last.Loss(), TestAccuracy: last.Accuracy(),
			Seconds: trainSeconds, ParamsSHA256: sum,
		})
	}
	res, err := gsync.Train(ctx, loop, state, func(ctx context.Context, s *gsync.TrainStep) error {
		var r mnist.Result
		if s.Plan.Accum > 0 {
			// Several micro-batches (the adaptive batch outgrew
			// --max-micro-batch, or a lone worker measures the noise).
			if r, err = micro.step(s); err != nil {
				return err
			}
		} else {
			if x, y, err = train.Gather(s.Batch.Indices, x, y); err != nil {
				return err
			}
			// Scale by size/Global rather than by the local batch: the
			// allreduce averages, so this gives the exact mean over the
			// global batch even when the ranks' shares differ in size.
			if r, err = model.ComputeGradients(x, y, float32(s.Size)/float32(s.Batch.Global)); err != nil {
				return err
			}
		}
		s.Session.RecordLoss(r.Loss()) // the mean per sample of this worker's share, for gorovod run's report
		if err := reduce(ctx, s.Session); err != nil {
			return err // a changed world: the loop redoes the step
		}
		opt.LR = float32(o.lr * o.lrFactor(s))
		model.Update(opt)
		current = r
		// Read now: once the step commits, the session may have moved to
		// the next world.
		ranIn = worldRank0(s.Session)
		return nil
	})
	if err != nil {
		return err
	}
	if res.Outcome != gsync.Completed {
		fmt.Fprintf(progress, "left the job at step %d\n", res.Steps)
		return nil
	}
	if o.pauseAtEnd && res.Rank == 0 {
		return syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	return nil
}

// worldRank0 is the member name of the rank 0 of the session's world.
func worldRank0(s *gsync.Session) string {
	if w := s.World(); len(w.Members) > 0 {
		return w.Members[0].Name
	}
	return ""
}

// gradReducer averages the model's float32 gradients across the world.
type gradReducer func(ctx context.Context, sess *gsync.Session) error

// newGradReducer returns the reducer for --grad-dtype: float32 reduces the
// gradients as they are; float16 and bfloat16 send them at half the bytes
// (Horovod's fp16 compression): converted before the allreduce, which sums
// in that dtype, and back after it. The parameters stay float32, and every
// rank converts the same reduced bits back, so they stay identical.
func newGradReducer(dtype string, grads []float32) gradReducer {
	switch dtype {
	case "float16":
		return halfReducer(grads, collective.NewF16, collective.F16.Float32)
	case "bfloat16":
		return halfReducer(grads, collective.NewBF16, collective.BF16.Float32)
	}
	buf := collective.SliceBuffer(grads)
	return func(ctx context.Context, sess *gsync.Session) error {
		return sess.Allreduce(ctx, gsync.Reduction{}, buf)
	}
}

func halfReducer[T collective.F16 | collective.BF16](grads []float32, narrow func(float32) T, widen func(T) float32) gradReducer {
	wire := make([]T, len(grads))
	buf := collective.SliceBuffer(wire)
	return func(ctx context.Context, sess *gsync.Session) error {
		for i, g := range grads {
			wire[i] = narrow(g)
		}
		if err := sess.Allreduce(ctx, gsync.Reduction{}, buf); err != nil {
			return err
		}
		for i, h := range wire {
			grads[i] = widen(h)
		}
		return nil
	}
}
