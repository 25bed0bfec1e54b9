package simulator

import (
	"fmt"

	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// agent is an adaptive (Pollux) job's view of itself, AdaptDL's agent: the
// throughput model refitted whenever a new configuration is measured, the
// gradient statistics of the latest step, and the batch-size search over
// them, all from package goodput.
type agent struct {
	profile goodput.Profile
	model   goodput.Model
	limits  goodput.Limits
	fitted  bool
}

func newAgent(t *Trace) *agent {
	return &agent{
		model: goodput.Model{InitBatch: t.InitBatchSize},
		limits: goodput.Limits{MaxBatch: t.MaxBatchSize, MinMicroBatch: t.MinLocalBatch,
			MaxMicroBatch: t.MaxLocalBatch, Accumulation: true},
	}
}

// observe records a step measured at a configuration and refits the
// throughput model when the configuration is new.
func (a *agent) observe(nodes, replicas, atomic int, stepTime, syncTime float64) error {
	seen := a.profile.Len()
	// The traces time one micro-batch per step: the accumulation steps
	// cost the step minus its sync each.
	if err := a.profile.Add(goodput.Observation{Nodes: nodes, Replicas: replicas, MicroBatch: atomic,
		StepTime: stepTime, SyncTime: syncTime}); err != nil {
		return err
	}
	if a.profile.Len() == seen {
		return nil // a known configuration: the trace gives the same times
	}
	perf, err := a.profile.Fit()
	if err != nil {
		return fmt.Errorf("fitting the throughput model: %w", err)
	}
	a.model.Perf = perf
	a.fitted = true
	return nil
}

// setGradStats records the gradient statistics of the last step.
func (a *agent) setGradStats(sqr, variance float64) {
	a.model.Grad = goodput.GradParams{Sqr: sqr, Var: variance}
}

// ready reports whether anything has been measured.
func (a *agent) ready() bool { return a.fitted }

// goodput is what the scheduler predicts the job's goodput with.
func (a *agent) goodput() func(nodes, replicas int) float64 {
	return scheduler.ModelGoodput(a.model, a.limits)
}

// optimize picks the per-GPU batch and accumulation steps for an allocation.
func (a *agent) optimize(nodes, replicas int) (atomic, accum int) {
	c, ok := a.model.Optimize(nodes, replicas, a.limits)
	if !ok {
		// No feasible batch size (more replicas than the largest batch
		// can feed): the smallest per-GPU batch, as the job's limits allow.
		return a.limits.MinMicroBatch, 0
	}
	return c.MicroBatch, c.Accum
}

// maxProfiledReplicas is the largest replica count measured.
func (a *agent) maxProfiledReplicas() int { return a.profile.MaxReplicas() }
