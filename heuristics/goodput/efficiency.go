package goodput

import (
	"fmt"
	"math"
	"strings"
)

// GradParams are the gradient statistics statistical efficiency is computed
// from, as the Estimator measures them.
type GradParams struct {
	// Sqr is |G|², the squared norm of the true (full-data) gradient.
	Sqr float64 `json:"sqr"`
	// Var is tr(Σ)/M0, the variance of a gradient over the initial batch
	// size M0 (Σ the per-sample gradient covariance).
	Var float64 `json:"var"`
}

// Floors applied to GradParams before use (AdaptDL's): the variance is at
// least MinVar, the square at least 0.
const MinVar = 1e-6

// floored returns the parameters with the floors applied.
func (g GradParams) floored() (sqr, v float64) {
	return math.Max(g.Sqr, 0), math.Max(g.Var, MinVar)
}

// Gain is the AdaScale gain at scale r = M/M0: how many steps at M0 one step
// at M is worth, (var + sqr)/(var/r + sqr), between 1 and r.
func (g GradParams) Gain(scale float64) float64 {
	sqr, v := g.floored()
	denom := v/scale + sqr
	if !(denom > 0) {
		return 1
	}
	return (v + sqr) / denom
}

// Efficiency is the statistical efficiency at scale r = M/M0: Gain(r)/r, the
// progress per sample at M relative to M0, equal to (φ+M0)/(φ+M) with φ the
// noise scale. It never rises with the batch size.
func (g GradParams) Efficiency(scale float64) float64 { return g.Gain(scale) / scale }

// NoiseScale is the gradient noise scale φ = M0·var/sqr, in samples: the
// batch size at which efficiency has halved relative to tiny batches
// (+Inf when the gradient's square is 0).
func (g GradParams) NoiseScale(initBatch int) float64 {
	sqr, v := g.floored()
	if sqr == 0 {
		return math.Inf(1)
	}
	return float64(initBatch) * v / sqr
}

// LRRule is how the learning rate scales with the batch size: the trainer
// multiplies the learning rate it would use at M0 by Factor.
type LRRule int

const (
	// AdaScale multiplies by the gain (var+sqr)/(var/r+sqr): linear scaling
	// while the gradient is noisy, none once it is exact (SGD; the default).
	AdaScale LRRule = iota
	// SqrtScale multiplies by √r (Adam and its relatives).
	SqrtScale
	// LinearScale multiplies by r.
	LinearScale
)

var lrRuleNames = [...]string{AdaScale: "adascale", SqrtScale: "sqrt", LinearScale: "linear"}

func (r LRRule) String() string {
	if r >= 0 && int(r) < len(lrRuleNames) {
		return lrRuleNames[r]
	}
	return fmt.Sprintf("lr-rule(%d)", int(r))
}

// ParseLRRule reads "adascale", "sqrt" or "linear" ("" is AdaScale).
func ParseLRRule(s string) (LRRule, error) {
	if s == "" {
		return AdaScale, nil
	}
	for i, n := range lrRuleNames {
		if strings.EqualFold(s, n) {
			return LRRule(i), nil
		}
	}
	return 0, fmt.Errorf("goodput: unknown learning-rate rule %q (want %s)", s, strings.Join(lrRuleNames[:], ", "))
}

// MarshalText writes the rule's name.
func (r LRRule) MarshalText() ([]byte, error) {
	if r < 0 || int(r) >= len(lrRuleNames) {
		return nil, fmt.Errorf("goodput: unknown learning-rate rule %d", int(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText reads a rule's name.
func (r *LRRule) UnmarshalText(b []byte) error {
	v, err := ParseLRRule(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Factor is the learning-rate multiplier at scale r = M/M0 (g is used by
// AdaScale only).
func (r LRRule) Factor(g GradParams, scale float64) float64 {
	switch r {
	case SqrtScale:
		return math.Sqrt(scale)
	case LinearScale:
		return scale
	}
	return g.Gain(scale)
}
