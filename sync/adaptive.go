package sync

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// AdaptiveConfig configures AdaptiveBatch. InitBatch is required; a zero
// field means its default.
type AdaptiveConfig struct {
	// InitBatch is M0, the global batch the job starts with and its
	// learning rate is tuned for.
	InitBatch int
	// MaxBatch is the largest global batch (0: InitBatch, the batch is
	// then only split among the workers).
	MaxBatch int
	// MinMicroBatch and MaxMicroBatch bound the samples one worker
	// processes at once (0: 1 and MaxBatch); MaxMicroBatch is what fits in
	// a worker's memory.
	MinMicroBatch, MaxMicroBatch int
	// NoAccumulation forbids gradient accumulation: without it a worker
	// accumulates micro-batches when its share of the batch exceeds
	// MaxMicroBatch (and, alone, once the batch exceeds InitBatch, so that
	// the gradient noise has two micro-batches to come from).
	NoAccumulation bool
	// LRRule scales the learning rate with the batch size: AdaScale (the
	// default), square root or linear (goodput.LRRule). The trainer
	// multiplies its learning rate by TrainStep.Plan.LRFactor.
	LRRule goodput.LRRule
	// WorkersPerNode is how many workers share a machine, for the
	// throughput model's sync time (1: each its own machine).
	WorkersPerNode int
	// RefitEvery is how often the throughput model is fitted again to the
	// steps measured (Pollux: 30 s); DecideEvery how often the batch size is
	// reconsidered with the newest gradient statistics (1 s). Both run on a
	// goroutine of their own, never on the training path.
	RefitEvery, DecideEvery time.Duration
	// MinSteps is how many steps must be measured before the first fit
	// (10).
	MinSteps int
	// Logger receives the batch-size decisions (default: discarded).
	Logger *slog.Logger
}

// DefaultAdaptiveConfig returns the defaults; set InitBatch.
func DefaultAdaptiveConfig() AdaptiveConfig {
	return AdaptiveConfig{WorkersPerNode: 1, RefitEvery: 30 * time.Second, DecideEvery: time.Second, MinSteps: 10}
}

func (c AdaptiveConfig) withDefaults() (AdaptiveConfig, error) {
	d := DefaultAdaptiveConfig()
	if c.InitBatch < 1 {
		return c, fmt.Errorf("%w: AdaptiveConfig.InitBatch %d: the initial batch M0 must be at least 1", ErrInvalidConfig, c.InitBatch)
	}
	if c.WorkersPerNode < 0 || c.RefitEvery < 0 || c.DecideEvery < 0 || c.MinSteps < 0 {
		return c, fmt.Errorf("%w: AdaptiveConfig: WorkersPerNode, RefitEvery, DecideEvery and MinSteps must not be negative", ErrInvalidConfig)
	}
	if c.LRRule < goodput.AdaScale || c.LRRule > goodput.LinearScale {
		return c, fmt.Errorf("%w: AdaptiveConfig.LRRule %v", ErrInvalidConfig, c.LRRule)
	}
	if c.WorkersPerNode == 0 {
		c.WorkersPerNode = d.WorkersPerNode
	}
	if c.RefitEvery == 0 {
		c.RefitEvery = d.RefitEvery
	}
	if c.DecideEvery == 0 {
		c.DecideEvery = d.DecideEvery
	}
	if c.MinSteps == 0 {
		c.MinSteps = d.MinSteps
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := c.limits().Validate(c.InitBatch); err != nil {
		return c, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if lim := c.limits().Resolved(c.InitBatch); lim.MaxMicroBatch > maxMicro || lim.MaxBatch > maxMicro {
		return c, fmt.Errorf("%w: AdaptiveConfig: batch sizes above %d", ErrInvalidConfig, maxMicro)
	}
	return c, nil
}

func (c AdaptiveConfig) limits() goodput.Limits {
	return goodput.Limits{MaxBatch: c.MaxBatch, MinMicroBatch: c.MinMicroBatch, MaxMicroBatch: c.MaxMicroBatch, Accumulation: !c.NoAccumulation}
}

// AdaptiveBatch is the batch policy that learns the batch size (AdaptDL /
// Pollux): each step's global batch, micro-batch and gradient accumulation
// maximize the predicted goodput — throughput × statistical efficiency — on
// the current world, and the learning-rate factor follows the batch size by
// the configured rule. Give it to TrainConfig.BatchPolicy.
//
// How every worker makes the same decision at the same step: the model is
// fitted and the batch size reconsidered on a goroutine of each worker
// (Fit every RefitEvery, Reconsider every DecideEvery, never on the
// training path), but only rank 0's result counts. Rank 0 sends its
// decision for the next step — micro-batch, accumulation and learning-rate
// factor — with each step's gradients, as integer digits beside them in
// the gradient allreduce (gns.go), so every worker receives the same
// decision in the same step and adopts it when the step commits, and no
// worker waits for the model. The plan in force is part of the job's state
// (a joining worker receives it); when the world changes size, every worker
// splits the current global batch over the new world by the same integer
// rule until rank 0 decides anew. Steps that changed the world are redone
// with the plan the world's state holds.
type AdaptiveBatch struct {
	cfg AdaptiveConfig
	lim goodput.Limits // resolved

	mu stdsync.Mutex
	st adaptiveState
	// What the background goroutine reads, updated by the committed steps.
	prof     goodput.Profile
	observed int
	grad     goodput.GradParams
	ready    bool
	rank     int
	// best is the background's newest choice for the world size replicas.
	best    goodput.Choice
	bestFor int // replicas; 0: none
	status  AdaptiveStatus
	// The background goroutine's alone.
	perf    goodput.PerfParams
	lastFit time.Time
}

// adaptiveState is the plan in force, the same on every worker (the state
// blob "sync.adaptive").
type adaptiveState struct {
	// Target is the global batch rank 0 chose; Micro and Accum its split
	// over Replicas workers (for another world size the split is derived
	// from Target).
	Target   int     `json:"target"`
	Micro    int     `json:"micro"`
	Accum    int     `json:"accum"`
	Replicas int     `json:"replicas"`
	LRFactor float64 `json:"lr_factor"`
}

// adaptiveBlob is the state name of the plan in force.
const adaptiveBlob = "sync.adaptive"

// NewAdaptiveBatch returns the policy, starting at InitBatch.
func NewAdaptiveBatch(cfg AdaptiveConfig) (*AdaptiveBatch, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	a := &AdaptiveBatch{cfg: cfg, lim: cfg.limits().Resolved(cfg.InitBatch)}
	a.st = adaptiveState{Target: cfg.InitBatch, LRFactor: 1}
	return a, nil
}

// Config returns the policy's configuration with the defaults filled in.
func (a *AdaptiveBatch) Config() AdaptiveConfig { return a.cfg }

// PlanBatch returns the plan in force for the world's size (every worker
// asks with the same Progress and holds the same state, so all get the
// same plan).
func (a *AdaptiveBatch) PlanBatch(p Progress) BatchPlan {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.Size >= 1 && a.st.Replicas != p.Size {
		a.st.Micro, a.st.Accum = a.split(a.st.Target, p.Size)
		a.st.Replicas = p.Size
	}
	return a.planLocked()
}

func (a *AdaptiveBatch) planLocked() BatchPlan {
	s := a.st
	return BatchPlan{Global: s.Replicas * s.Micro * (s.Accum + 1), MicroBatch: s.Micro, Accum: s.Accum, LRFactor: s.LRFactor}
}

// split divides a global batch among k workers in integers, as
// goodput.Model.Optimize does: accumulate when a share exceeds the largest
// micro-batch (and, on one worker, once the batch exceeds M0), the
// micro-batch rounded up (down where the shares would add up to more than
// the largest batch, and not below the smallest) and kept within its
// bounds.
func (a *AdaptiveBatch) split(global, k int) (micro, accum int) {
	per := (global + k - 1) / k // a worker's share
	if a.lim.Accumulation {
		accum = (per+a.lim.MaxMicroBatch-1)/a.lim.MaxMicroBatch - 1
		if k == 1 && global > a.cfg.InitBatch {
			accum = max(accum, 1)
		}
	}
	accum = min(accum, maxAccum)
	micro = (per + accum) / (accum + 1)
	if down := a.lim.MaxBatch / (k * (accum + 1)); k*micro*(accum+1) > a.lim.MaxBatch && k*down*(accum+1) >= max(a.cfg.InitBatch, k*a.lim.MinMicroBatch) {
		// Shares rounded up would add up to more than the largest batch:
		// round down, unless that falls below the smallest.
		micro = down
	}
	return min(max(micro, a.lim.MinMicroBatch), a.lim.MaxMicroBatch), accum
}

// propose is rank 0's decision for the next step: the background's choice
// for this world if it has one, else the plan in force; and the learning-
// rate factor of that batch size by the configured rule.
func (a *AdaptiveBatch) propose(grad goodput.GradParams, ready bool) (batchDecision, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.st.Replicas < 1 {
		return batchDecision{}, false
	}
	d := batchDecision{Micro: a.st.Micro, Accum: a.st.Accum}
	if a.bestFor == a.st.Replicas {
		d.Micro, d.Accum = a.best.MicroBatch, a.best.Accum
	}
	if !ready {
		grad = goodput.GradParams{Sqr: 1, Var: goodput.MinVar} // no noise measured: no gain
	}
	scale := float64(a.st.Replicas*d.Micro*(d.Accum+1)) / float64(a.cfg.InitBatch)
	f := a.cfg.LRRule.Factor(grad, scale)
	q := math.Round(math.Ldexp(f, lrFraction))
	d.LRFactor = math.Ldexp(min(max(q, 1), 1<<(4*lrDigits)-1), -lrFraction)
	return d, true
}

// committed records the step that ran for the throughput model and adopts
// rank 0's decision for the next.
func (a *AdaptiveBatch) committed(c stepCommit) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.st
	if k := c.Replicas; k == s.Replicas && c.Global == k*s.Micro*(s.Accum+1) && c.Elapsed > 0 && c.Waited < c.Elapsed {
		o := goodput.Observation{Nodes: a.nodes(k), Replicas: k, MicroBatch: s.Micro, Accum: s.Accum,
			StepTime: c.Elapsed.Seconds(), SyncTime: c.Waited.Seconds()}
		if a.prof.Add(o) == nil {
			a.observed++
		}
	}
	if d := c.Decision; c.Decided && d.Micro >= 1 && d.Accum >= 0 && d.LRFactor > 0 {
		if d.Micro != s.Micro || d.Accum != s.Accum || c.Replicas != s.Replicas {
			a.cfg.Logger.Info("batch size", "global", c.Replicas*d.Micro*(d.Accum+1), "micro", d.Micro, "accum", d.Accum,
				"workers", c.Replicas, "lr_factor", d.LRFactor)
		}
		a.st = adaptiveState{Target: c.Replicas * d.Micro * (d.Accum + 1), Micro: d.Micro, Accum: d.Accum, Replicas: c.Replicas, LRFactor: d.LRFactor}
	}
	a.grad, a.ready, a.rank = c.Grad, c.GradReady, c.Rank
}

func (a *AdaptiveBatch) nodes(k int) int {
	return (k + a.cfg.WorkersPerNode - 1) / a.cfg.WorkersPerNode
}

// run is the background goroutine: it reconsiders the batch size every
// DecideEvery until ctx ends.
func (a *AdaptiveBatch) run(ctx context.Context) {
	t := time.NewTicker(a.cfg.DecideEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			a.reconsider(now)
		}
	}
}

// reconsider refits the throughput model when due and picks the batch
// configuration of highest goodput for the current world, switching only for
// a predicted speed-up above goodput.SwitchSpeedup. Only rank 0 does (its
// choice is the one sent).
func (a *AdaptiveBatch) reconsider(now time.Time) {
	a.mu.Lock()
	if a.rank != 0 || !a.ready || a.observed < a.cfg.MinSteps || a.st.Replicas < 1 {
		a.mu.Unlock()
		return
	}
	var points []goodput.Point
	if a.lastFit.IsZero() || now.Sub(a.lastFit) >= a.cfg.RefitEvery {
		points = a.prof.Points()
	}
	grad, k := a.grad, a.st.Replicas
	cur := goodput.Choice{MicroBatch: a.st.Micro, Accum: a.st.Accum}
	a.mu.Unlock()

	if points != nil {
		perf, err := goodput.Fit(points)
		if err != nil {
			a.cfg.Logger.Warn("throughput model: fit failed", "err", err)
			return
		}
		a.perf, a.lastFit = perf, now
		a.mu.Lock()
		a.status.Refits++
		a.status.Configurations = len(points)
		a.mu.Unlock()
	}
	// a.perf and a.lastFit are this goroutine's alone: no lock while the
	// model searches.
	model := goodput.Model{Perf: a.perf, Grad: grad, InitBatch: a.cfg.InitBatch}
	next, speedup, _ := model.Reconsider(a.nodes(k), k, a.cfg.limits(), cur)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.best, a.bestFor = next, k
	a.status.Model, a.status.Choice, a.status.Speedup, a.status.Replicas = model, next, speedup, k
}

// AdaptiveStatus is what the policy's model says, for logs and reports.
type AdaptiveStatus struct {
	// Model is rank 0's newest goodput model (zero before the first fit).
	Model goodput.Model
	// Choice is its best configuration for Replicas workers, Speedup its
	// predicted goodput over the plan in force when it was computed.
	Choice   goodput.Choice
	Replicas int
	Speedup  float64
	// Refits counts the fits; Configurations is how many (nodes,
	// replicas, micro-batch) configurations the last one saw.
	Refits, Configurations int
}

// Status returns the model's newest state (on rank 0; other workers do not
// fit).
func (a *AdaptiveBatch) Status() AdaptiveStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
}

func (a *AdaptiveBatch) marshal() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return json.Marshal(a.st)
}

func (a *AdaptiveBatch) unmarshal(b []byte) error {
	var s adaptiveState
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("sync: adaptive batch state: %w", err)
	}
	if s.Target < 1 || s.Micro < 0 || s.Accum < 0 || s.Replicas < 0 || !(s.LRFactor > 0) || math.IsInf(s.LRFactor, 0) {
		return fmt.Errorf("sync: adaptive batch state out of range: %+v", s)
	}
	a.mu.Lock()
	a.st = s
	a.mu.Unlock()
	return nil
}
