package goodput

import (
	"fmt"
	"math"
)

// PerfParams are Pollux's throughput model's seven parameters θ = (α_c, β_c,
// α_n, β_n, α_r, β_r, γ), times in seconds:
//
//	T_acc(m)    = α_c + β_c·m                     one micro-batch of m samples per replica
//	T_net(N, K) = α + β·max(K−2, 1e-8)            (α,β) = (α_n,β_n) if N > 1 nodes,
//	                                              (α_r,β_r) if N = 1 and K > 1 replicas, ≈ 0 if K = 1
//	T_opt       = (T_acc^γ + T_net^γ)^(1/γ)       the last micro-batch overlapped with the sync
//	T_iter      = s·T_acc + T_opt                 with s extra (accumulated) micro-batches
//
// γ ∈ [1, 10] is the overlap of compute and gradient sync: 1 none (the times
// add up), 10 nearly full (the larger one hides the other).
type PerfParams struct {
	AlphaC float64 `json:"alpha_c"` // constant part of a micro-batch's compute time
	BetaC  float64 `json:"beta_c"`  // compute time per sample of the micro-batch
	AlphaN float64 `json:"alpha_n"` // sync time across nodes
	BetaN  float64 `json:"beta_n"`  // its growth per replica beyond two
	AlphaR float64 `json:"alpha_r"` // sync time between replicas of one node
	BetaR  float64 `json:"beta_r"`  // its growth per replica beyond two
	Gamma  float64 `json:"gamma"`   // overlap of compute and sync, in [1, 10]
}

// paramFloor is the lower bound of the six time parameters and the network
// time of a single replica (AdaptDL's slack against dividing by zero).
const paramFloor = 1e-8

// Bounds of γ.
const (
	MinGamma = 1.0
	MaxGamma = 10.0
)

// Validate checks the parameters are usable: times finite and positive, γ in
// [MinGamma, MaxGamma].
func (p PerfParams) Validate() error {
	for _, v := range []struct {
		name string
		x    float64
	}{{"alpha_c", p.AlphaC}, {"beta_c", p.BetaC}, {"alpha_n", p.AlphaN}, {"beta_n", p.BetaN}, {"alpha_r", p.AlphaR}, {"beta_r", p.BetaR}} {
		if !(v.x > 0) || math.IsInf(v.x, 0) {
			return fmt.Errorf("goodput: %s must be finite and > 0, got %v", v.name, v.x)
		}
	}
	if !(p.Gamma >= MinGamma && p.Gamma <= MaxGamma) {
		return fmt.Errorf("goodput: gamma must be in [%v, %v], got %v", MinGamma, MaxGamma, p.Gamma)
	}
	return nil
}

// AccumTime is T_acc(m), the compute time of one micro-batch of m samples on
// one replica.
func (p PerfParams) AccumTime(m int) float64 { return p.AlphaC + p.BetaC*float64(m) }

// NetworkTime is T_net, the gradient sync time of replicas spread over nodes:
// the slowest link (across nodes, else within one) decides.
func (p PerfParams) NetworkTime(nodes, replicas int) float64 {
	a, b := paramFloor, paramFloor
	switch {
	case nodes > 1:
		a, b = p.AlphaN, p.BetaN
	case replicas > 1:
		a, b = p.AlphaR, p.BetaR
	}
	return a + b*retrogression(replicas)
}

// retrogression is max(K−2, 1e-8): a ring allreduce's rounds beyond two.
func retrogression(replicas int) float64 { return math.Max(float64(replicas-2), paramFloor) }

// OptimTime is T_opt, the time of the micro-batch that ends with the gradient
// sync.
func (p PerfParams) OptimTime(nodes, replicas, m int) float64 {
	return overlap(p.AccumTime(m), p.NetworkTime(nodes, replicas), p.Gamma)
}

// StepTime is T_iter = s·T_acc + T_opt: one optimizer step of s+1
// micro-batches of m samples on each replica.
func (p PerfParams) StepTime(nodes, replicas, m, s int) float64 {
	acc := p.AccumTime(m)
	return float64(s)*acc + overlap(acc, p.NetworkTime(nodes, replicas), p.Gamma)
}

// Throughput is samples per second: the global batch K·m·(s+1) over T_iter.
func (p PerfParams) Throughput(nodes, replicas, m, s int) float64 {
	return float64(replicas*m*(s+1)) / p.StepTime(nodes, replicas, m, s)
}

// overlap is (a^γ + b^γ)^(1/γ) for a, b > 0, computed as
// hi·exp(log1p((lo/hi)^γ)/γ) so that neither power overflows nor underflows
// to a wrong answer (and with Exp and Log, about twice as fast as math.Pow).
func overlap(a, b, gamma float64) float64 {
	hi, lo := a, b
	if lo > hi {
		hi, lo = lo, hi
	}
	if !(hi > 0) {
		return 0
	}
	return hi * math.Exp(math.Log1p(math.Exp(gamma*math.Log(lo/hi)))/gamma)
}
