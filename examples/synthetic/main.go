package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/envconfig"
	gsync "github.com/gorovod/gorovod/sync"
	"github.com/gorovod/gorovod/sync/sampler"
)

type options struct {
	steps        int64
	samples      int
	batch        int
	modelSize    int
	compute      time.Duration
	seed         uint64
	lr           float64
	asJSON       bool
	logSamples   bool
	straggler    int
	stragglerIdx int
	extraStepIdx int
	stragglerMul float64
	overhead     time.Duration
	perWorker    time.Duration
	verbose      bool
	noStats      bool
	freezeIdx    int
	freezeStep   int64
	freezeFor    time.Duration
	suspicion    int
}

func main() {
	var o options
	flag.Int64Var(&o.steps, "steps", 100, "global steps to train")
	flag.IntVar(&o.samples, "samples", 4096, "samples in the synthetic data set")
	flag.IntVar(&o.batch, "batch", 64, "global batch size")
	flag.IntVar(&o.modelSize, "model-size", 1<<18, "parameters (float32)")
	flag.DurationVar(&o.compute, "compute", 100*time.Microsecond, "simulated compute per sample")
	flag.Uint64Var(&o.seed, "seed", 1, "data order and initialisation seed")
	flag.Float64Var(&o.lr, "lr", 0.1, "learning rate")
	flag.BoolVar(&o.asJSON, "json", false, "print one JSON object per step")
	flag.BoolVar(&o.logSamples, "log-samples", false, "with --json, list the sample indices of each step")
	flag.DurationVar(&o.overhead, "step-overhead", 0, "simulated per-step time that does not shrink with more workers (optimizer, input pipeline)")
	flag.DurationVar(&o.perWorker, "overhead-per-worker", 0, "simulated per-step time for each worker beyond the first, as a network's latency term grows with the ring")
	flag.IntVar(&o.straggler, "straggler-rank", -1, "rank whose compute is slowed down")
	flag.IntVar(&o.stragglerIdx, "straggler-worker", -1, "launch index (the [i] of gorovod run) of the process whose compute is slowed down: a slow machine, which a replacement escapes")
	flag.IntVar(&o.extraStepIdx, "extra-step-worker", -1, "launch index of a process that trains one step more than --steps, as a worker whose last step failed for it alone must once the others have finished (tests the end of a job)")
	flag.Float64Var(&o.stragglerMul, "straggler-factor", 2, "how much slower the straggler computes")
	flag.BoolVar(&o.verbose, "v", false, "log the elastic layer's decisions to stderr")
	flag.BoolVar(&o.noStats, "no-stats", false, "send no step statistics to the driver (to measure what they cost)")
	flag.IntVar(&o.freezeIdx, "freeze-worker", -1, "launch index of a process whose training loop blocks (its process and the library's goroutines live on) before the gradient allreduce of --freeze-step, for --freeze-for: a stuck data loader, for the stall inspector")
	flag.Int64Var(&o.freezeStep, "freeze-step", 10, "the step --freeze-worker blocks at")
	flag.DurationVar(&o.freezeFor, "freeze-for", time.Minute, "how long --freeze-worker blocks")
	flag.IntVar(&o.suspicion, "gossip-suspicion-mult", 0, "gossip's SuspicionMult (membership.Config; 0: its default): a member that answers nothing is declared dead only after about this many gossip probe intervals (200 ms), so a large value leaves a frozen worker to the collectives' I/O timeout and the proposer's liveness probe (tests)")
	flag.Parse()
	if o.steps < 1 || o.samples < 1 || o.batch < 1 || o.modelSize < 1 || o.overhead < 0 || o.perWorker < 0 || o.stragglerMul <= 0 || o.freezeFor < 0 || o.suspicion < 0 {
		fmt.Fprintln(os.Stderr, "synthetic: --steps, --samples, --batch, --model-size and --straggler-factor must be positive, the overheads and --gossip-suspicion-mult not negative")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "synthetic:", err)
		os.Exit(1)
	}
}

type stepLine struct {
	Step         int64   `json:"step"`
	Epoch        uint64  `json:"epoch"`
	WorldEpoch   uint64  `json:"world_epoch"`
	Rank         int     `json:"rank"`
	Size         int     `json:"size"`
	Loss         float64 `json:"loss"`
	ParamsSHA256 string  `json:"params_sha256"`
	Worker       string  `json:"worker"`
	Samples      []int   `json:"samples,omitempty"`
	Start        int     `json:"start"`  // the step's place in the data epoch's order
	Global       int     `json:"global"` // samples the whole world processed in the step
	StepMS       float64 `json:"step_ms"`
	// GradSqr and GradVar are the job's smoothed gradient square and
	// variance after the step (goodput.GradParams, measured by the
	// library from the allreduce's input at two or more workers); absent
	// before the first estimate. A recorded trace of this trainer for the
	// cluster simulator takes them from here.
	GradSqr *float64 `json:"grad_sqr,omitempty"`
	GradVar *float64 `json:"grad_var,omitempty"`
	// TimeUS is when this worker committed the step (µs since the Unix
	// epoch, its own clock): what a measurement of a world change reads,
	// rather than when the line reached it through the launcher.
	TimeUS int64 `json:"time_us"`
}

func run(o options) error {
	// SIGINT stops at once (the job is ending); SIGTERM leaves gracefully
	// (sync.Train sees to it): this worker keeps training until the others
	// have moved to a world without it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT)
	defer stop()

	params := make([]float32, o.modelSize)
	for i := range params {
		params[i] = float32(math.Sin(float64(uint64(i)+o.seed))) * 0.1
	}
	order, err := sampler.New(sampler.Config{N: o.samples, Seed: o.seed, Shuffle: true})
	if err != nil {
		return err
	}
	state := gsync.NewState()
	state.RegisterTensor("params", params)
	index, launched, err := envconfig.LaunchIndex(os.Getenv)
	if err != nil {
		return err
	}
	slow := launched && index == o.stragglerIdx
	freeze := launched && index == o.freezeIdx
	cfg := gsync.TrainConfig{Steps: o.steps, Data: order, GlobalBatch: o.batch}
	if launched && index == o.extraStepIdx {
		cfg.Steps++
	}
	cfg.Worker.DisableStats = o.noStats
	cfg.Worker.Membership.SuspicionMult = o.suspicion
	if o.verbose {
		cfg.Worker.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}

	grads := make([]float32, o.modelSize)
	gradBuf := collective.SliceBuffer(grads)
	var (
		began time.Time
		loss  float64
	)
	// A committed step (also the one at whose end this worker leaves the job).
	cfg.Committed = func(ctx context.Context, s *gsync.TrainStep) error {
		if !o.asJSON {
			return nil
		}
		line := stepLine{Step: s.Number, Epoch: s.Batch.Epoch, WorldEpoch: s.World, Rank: s.Rank, Size: s.Size, Loss: loss,
			ParamsSHA256: paramsSHA256(params), Worker: s.Session.Self().Name, Start: s.Batch.Start, Global: s.Batch.Global,
			StepMS: float64(time.Since(began).Microseconds()) / 1000, TimeUS: time.Now().UnixMicro()}
		if o.logSamples {
			line.Samples = s.Batch.Indices
		}
		if g, ok := s.Session.GradientNoise(); ok {
			line.GradSqr, line.GradVar = &g.Sqr, &g.Var
		}
		b, _ := json.Marshal(line)
		fmt.Printf("%s\n", b)
		return nil
	}
	_, err = gsync.Train(ctx, cfg, state, func(ctx context.Context, s *gsync.TrainStep) error {
		began = time.Now()
		loss = computeGrads(o, s.Rank, s.Size, slow, params, grads, s.Batch)
		if len(s.Batch.Indices) > 0 {
			s.Session.RecordLoss(sampleLoss(params, s.Batch.Indices))
		}
		if freeze && s.Number == o.freezeStep && s.Attempt == 0 {
			fmt.Fprintf(os.Stderr, "synthetic: freezing the training loop at step %d for %v\n", s.Number, o.freezeFor)
			select {
			case <-time.After(o.freezeFor):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := s.Session.Allreduce(ctx, gsync.Reduction{}, gradBuf); err != nil {
			return err
		}
		for i, g := range grads {
			params[i] -= float32(o.lr) * g
		}
		return nil
	})
	return err
}

// computeGrads sleeps for the simulated compute and fills grads with this
// rank's share of the global mean gradient of a quadratic loss pulling the
// parameters toward targets that depend on the samples.
//
// The simulated step time of a world of k workers sharing a global batch B
// is thus compute·B/k + step-overhead + overhead-per-worker·(k−1), plus the
// real allreduce: a curve whose best worker count can be worked out by hand.
func computeGrads(o options, rank, size int, slow bool, params, grads []float32, st sampler.Batch) float64 {
	d := o.compute * time.Duration(len(st.Indices))
	if rank == o.straggler || slow {
		d = time.Duration(float64(d) * o.stragglerMul)
	}
	time.Sleep(d + o.overhead + o.perWorker*time.Duration(size-1))
	var target float64
	for _, idx := range st.Indices {
		target += float64(idx%17) / 17
	}
	// The world averages; scaling by size/Global makes the average the exact
	// global mean over the step's samples.
	scale := float32(float64(size) / float64(st.Global))
	n := float32(len(st.Indices))
	var loss float64
	for i, p := range params {
		diff := p*n - float32(target)*0.01
		grads[i] = diff * scale
		if i < 64 {
			loss += float64(diff * diff)
		}
	}
	return loss
}

// sampleLoss is the mean per sample of the loss whose gradient computeGrads
// computes, ½·Σᵢ(pᵢ − 0.01·tₛ)² for sample s (over the first 64 parameters,
// as the step lines' loss): the figure the driver's progress records, metrics
// and run report show (Session.RecordLoss), comparable across world sizes.
func sampleLoss(params []float32, indices []int) float64 {
	var sum float64
	for _, idx := range indices {
		t := 0.01 * float64(idx%17) / 17
		for _, p := range params[:min(64, len(params))] {
			d := float64(p) - t
			sum += d * d / 2
		}
	}
	return sum / float64(len(indices))
}

func paramsSHA256(p []float32) string {
	b := make([]byte, 4*len(p))
	for i, v := range p {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
