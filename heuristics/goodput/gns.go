package goodput

import (
	"errors"
	"fmt"
	"math"
)

// StepNorms is what the sync layer measures of one optimizer step for the
// gradient noise estimator: a few squared norms, summed where they are
// computed, that ride along with the gradient allreduce (or the stats
// channel) — no extra collective.
//
// The step averages c = replicas × micro-batches-per-replica gradients g_i,
// each the mean gradient of one micro-batch of M/c samples, into ḡ. The
// micro-batches are assumed equal in size (the estimator divides M by c).
type StepNorms struct {
	// Batch is M, the step's global batch: samples over all replicas and
	// micro-batches.
	Batch int
	// MicroBatches is c, the number of gradients averaged into the step's.
	MicroBatches int
	// LocalSqr is Σ_i ‖g_i‖² over the c micro-batch gradients, each taken
	// before any averaging or accumulation (each replica sums its own; the
	// allreduce sums the replicas'). Ignored when c = 1.
	LocalSqr float64
	// TotalSqr is ‖ḡ‖², the squared norm of the averaged gradient (after the
	// allreduce and the division by the accumulation count).
	TotalSqr float64

	// For a step with c = 1 (one replica, no accumulation) the estimate
	// comes from two consecutive steps instead: the caller keeps the
	// previous step's gradient g_prev while c stays 1, and reports
	// HasPrev with the two numbers below. It drops g_prev when c becomes
	// larger than 1; the estimator itself ignores a pair whose steps
	// differ in batch size or are not consecutive single-micro-batch steps.
	HasPrev bool
	PrevSqr float64 // ‖g_prev‖²
	PrevDot float64 // ⟨g_prev, ḡ⟩
}

// Estimate is one step's unsmoothed estimate of the gradient statistics.
type Estimate struct {
	// Used is false when the step gave no estimate: a single micro-batch
	// without a usable previous step.
	Used bool
	// Pair is true when the estimate came from two consecutive steps.
	Pair bool
	// Sqr and Var as in GradParams, before smoothing and floors.
	Sqr, Var float64
}

// DefaultSmoothing is the per-M0-sample smoothing factor of the moving
// averages: a step of M samples decays the old average by 0.999^(M/M0).
const DefaultSmoothing = 0.999

// EstimatorState is the estimator's state, to checkpoint with the job and
// restore in a worker that joins (every replica computes the same state from
// the same global numbers, so rank 0's copy is everyone's).
type EstimatorState struct {
	// The bias-corrected moving averages of sqr and var: Biased/Unbias
	// each (Adam-style bias correction of an average started at 0).
	SqrBiased float64 `json:"sqr_biased"`
	SqrUnbias float64 `json:"sqr_unbias"`
	VarBiased float64 `json:"var_biased"`
	VarUnbias float64 `json:"var_unbias"`
	// Consecutive is true when the averages come from the consecutive-steps
	// estimator, which is biased (the weights move between the two steps);
	// the first step with c > 1 restarts the averages.
	Consecutive bool `json:"consecutive"`
	// Estimates counts the steps averaged in.
	Estimates int64 `json:"estimates"`
}

// Estimator is AdaptDL's gradient noise estimator: one Observe per step,
// GradParams whenever wanted. It is not safe for concurrent use (the sync
// layer calls it from the step's goroutine).
type Estimator struct {
	initBatch float64
	logSmooth float64 // ln(smoothing)
	st        EstimatorState
	// prevBatch is the batch of the previous step when it had a single
	// micro-batch (the step a PrevDot refers to), 0 otherwise.
	prevBatch int
}

// EstimatorConfig configures an Estimator.
type EstimatorConfig struct {
	// InitBatch is M0, the batch size the statistics are scaled to (the
	// job's initial global batch); required.
	InitBatch int
	// Smoothing is the decay per M0 samples, in (0, 1); 0 means
	// DefaultSmoothing.
	Smoothing float64
}

// NewEstimator returns an estimator with no estimates yet.
func NewEstimator(cfg EstimatorConfig) (*Estimator, error) {
	if cfg.InitBatch < 1 {
		return nil, fmt.Errorf("goodput: the estimator needs the initial batch size M0 ≥ 1, got %d", cfg.InitBatch)
	}
	if cfg.Smoothing == 0 {
		cfg.Smoothing = DefaultSmoothing
	}
	if !(cfg.Smoothing > 0 && cfg.Smoothing < 1) {
		return nil, fmt.Errorf("goodput: smoothing must be in (0, 1), got %v", cfg.Smoothing)
	}
	return &Estimator{initBatch: float64(cfg.InitBatch), logSmooth: math.Log(cfg.Smoothing)}, nil
}

// Errors of Observe; the step is not counted.
var (
	ErrBadStep   = errors.New("goodput: step norms need Batch ≥ MicroBatches ≥ 1")
	ErrNonFinite = errors.New("goodput: step norms are not finite (an overflowing or NaN gradient): step skipped")
	ErrNegative  = errors.New("goodput: squared norms must not be negative")
)

// Observe takes one step's norms, updates the moving averages and returns the
// step's own estimate. An invalid step (its error says which) changes
// nothing but forgets the previous step, so no pair spans it.
//
// With c > 1 micro-batches: local = LocalSqr/c, total = TotalSqr,
//
//	sqr = (c·total − local)/(c−1),  var = (local − total)·(M/M0)/(c−1).
//
// With c = 1 and the previous step: local = (‖g_prev‖² + ‖g‖²)/2, total =
// ‖(g_prev+g)/2‖², and the same formulas with c = 2 over 2M samples. Each
// estimate enters the averages with decay θ = smoothing^(samples/M0).
func (e *Estimator) Observe(n StepNorms) (Estimate, error) {
	prevBatch := e.prevBatch
	e.prevBatch = 0
	if n.MicroBatches < 1 || n.Batch < n.MicroBatches {
		return Estimate{}, ErrBadStep
	}
	if !finite(n.TotalSqr) || (n.MicroBatches > 1 && !finite(n.LocalSqr)) ||
		(n.MicroBatches == 1 && n.HasPrev && (!finite(n.PrevSqr) || !finite(n.PrevDot))) {
		return Estimate{}, ErrNonFinite
	}
	if n.TotalSqr < 0 || (n.MicroBatches > 1 && n.LocalSqr < 0) || (n.MicroBatches == 1 && n.HasPrev && n.PrevSqr < 0) {
		return Estimate{}, ErrNegative
	}
	var count, samples, local, total float64
	pair := n.MicroBatches == 1
	if pair {
		e.prevBatch = n.Batch
		if !n.HasPrev || prevBatch != n.Batch {
			return Estimate{}, nil
		}
		count, samples = 2, 2*float64(n.Batch)
		local = (n.PrevSqr + n.TotalSqr) / 2
		total = (n.PrevSqr + n.TotalSqr + 2*n.PrevDot) / 4
	} else {
		count, samples = float64(n.MicroBatches), float64(n.Batch)
		local = n.LocalSqr / count
		total = n.TotalSqr
	}
	scale := samples / e.initBatch
	est := Estimate{Used: true, Pair: pair,
		Sqr: (count*total - local) / (count - 1),
		Var: (local - total) * scale / (count - 1)}
	if !pair && e.st.Consecutive {
		// The unbiased estimator takes over: drop what the biased one left.
		e.st.SqrBiased, e.st.SqrUnbias, e.st.VarBiased, e.st.VarUnbias = 0, 0, 0, 0
	}
	e.st.Consecutive = pair
	theta := math.Exp(e.logSmooth * scale)
	e.st.SqrBiased = theta*e.st.SqrBiased + (1-theta)*est.Sqr
	e.st.SqrUnbias = theta*e.st.SqrUnbias + (1 - theta)
	e.st.VarBiased = theta*e.st.VarBiased + (1-theta)*est.Var
	e.st.VarUnbias = theta*e.st.VarUnbias + (1 - theta)
	e.st.Estimates++
	return est, nil
}

// Ready reports whether any step has been averaged in.
func (e *Estimator) Ready() bool { return e.st.SqrUnbias > 0 }

// Params returns the smoothed statistics, floored (Var ≥ MinVar, Sqr ≥ 0).
// Before the first estimate they are AdaptDL's starting point, sqr 1 and var
// MinVar: no measurable noise, so no larger batch looks worth it.
func (e *Estimator) Params() GradParams {
	if !e.Ready() {
		return GradParams{Sqr: 1, Var: MinVar}
	}
	return GradParams{Sqr: math.Max(e.st.SqrBiased/e.st.SqrUnbias, 0), Var: math.Max(e.st.VarBiased/e.st.VarUnbias, MinVar)}
}

// State returns the estimator's state for a checkpoint.
func (e *Estimator) State() EstimatorState { return e.st }

// Restore replaces the estimator's state with a checkpointed one; the
// previous step is forgotten (its gradient is not in the checkpoint).
func (e *Estimator) Restore(s EstimatorState) error {
	for _, v := range []float64{s.SqrBiased, s.SqrUnbias, s.VarBiased, s.VarUnbias} {
		if !finite(v) {
			return errors.New("goodput: estimator state is not finite")
		}
	}
	if s.SqrUnbias < 0 || s.VarUnbias < 0 || s.SqrUnbias > 1 || s.VarUnbias > 1 || s.Estimates < 0 {
		return errors.New("goodput: estimator state out of range (bias corrections must be in [0, 1])")
	}
	e.st, e.prevBatch = s, 0
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
