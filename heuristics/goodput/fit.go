package goodput

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/optimize"
)

// Point is one configuration's measured times, the input of Fit: the mean
// compute time of a micro-batch and the mean time of the micro-batch that
// ends with the gradient sync.
type Point struct {
	Nodes, Replicas int
	MicroBatch      int     // m
	AccumTime       float64 // measured T_acc, seconds
	OptimTime       float64 // measured T_opt, seconds
}

func (p Point) validate() error {
	if p.Nodes < 1 || p.Replicas < p.Nodes || p.MicroBatch < 1 {
		return fmt.Errorf("goodput: point needs 1 ≤ nodes ≤ replicas and a micro-batch ≥ 1, got %d nodes, %d replicas, micro-batch %d",
			p.Nodes, p.Replicas, p.MicroBatch)
	}
	if !(p.AccumTime > 0) || !(p.OptimTime > 0) || math.IsInf(p.AccumTime, 0) || math.IsInf(p.OptimTime, 0) {
		return fmt.Errorf("goodput: point needs finite times > 0, got accum %v s, optim %v s", p.AccumTime, p.OptimTime)
	}
	return nil
}

// The fit's regularizers and starting point (AdaptDL's fit_perf_params).
const (
	gammaReg         = 1e-3 // weight of (γ−1)²: a smaller γ is easier to fit
	retrogressionReg = 1e-2 // weight of (β/α)²: prefer the optimistic model
	startAlpha       = 0.1
	startBeta        = 0.01
	startGamma       = 1.001
	// unseenPrior: without multi-node data, inter-node sync is assumed at
	// least this much slower than within a node.
	unseenPrior = 1.1
)

// Parameter indices in the fit's vector.
const (
	iAlphaC = iota
	iBetaC
	iAlphaN
	iBetaN
	iAlphaR
	iBetaR
	iGamma
	nParams
)

// Fit fits the throughput model to measured points as AdaptDL does: it
// minimizes
//
//	RMSE(log T̂_acc, log T_acc) + RMSE(log T̂_opt, log T_opt)
//	  + 1e-3·(γ−1)² + 1e-2·((β_n/α_n)² + (β_r/α_r)²)
//
// from θ0 = (0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001), the times bounded below
// by 1e-8 and γ to [1, 10]. What the data cannot tell is pinned: with one
// micro-batch size α_c = mean(T_acc)/2; without multi-node points α_n = β_n =
// 1e-8; without single-node multi-replica points α_r = β_r = 1e-8; without
// more than two replicas β_n = β_r = 1e-8. Without multi-node points, α_n and
// β_n are finally raised to at least 1.1·α_r and 1.1·β_r: another node is
// never predicted faster than this one.
//
// gonum has no bounded quasi-Newton method (no L-BFGS-B), so the bounds are
// kept by reparameterization: each time parameter is 1e-8 + u² and γ is
// 1 + 9·sin²(v), and BFGS runs unconstrained on (u, v) with the analytic
// gradient. Every (u, v) is feasible, and a bound is reached at a finite
// point (u = 0, v = 0 or π/2) where the gradient is smooth, so the search can
// settle on it or leave it again. (An exponential transform, 1e-8 + e^u, was
// tried first: a parameter pushed towards its bound went to u → −∞, where its
// gradient vanishes, and stayed there — on exact data the fit then stopped at
// three times the truth's loss.) Pinned parameters are left out of the
// search.
func Fit(points []Point) (PerfParams, error) {
	if len(points) == 0 {
		return PerfParams{}, errors.New("goodput: nothing to fit (no measured points)")
	}
	for _, p := range points {
		if err := p.validate(); err != nil {
			return PerfParams{}, err
		}
	}
	theta := [nParams]float64{startAlpha, startBeta, startAlpha, startBeta, startAlpha, startBeta, startGamma}
	var pinned [nParams]bool
	multiNode, singleNodeMulti, moreThanTwo, oneMicro := false, false, false, true
	var accumSum float64
	for _, p := range points {
		multiNode = multiNode || p.Nodes > 1
		singleNodeMulti = singleNodeMulti || (p.Nodes == 1 && p.Replicas > 1)
		moreThanTwo = moreThanTwo || p.Replicas > 2
		oneMicro = oneMicro && p.MicroBatch == points[0].MicroBatch
		accumSum += p.AccumTime
	}
	pin := func(i int, v float64) { theta[i], pinned[i] = v, true }
	if oneMicro {
		pin(iAlphaC, accumSum/float64(len(points))/2)
	}
	if !multiNode {
		pin(iAlphaN, paramFloor)
		pin(iBetaN, paramFloor)
	}
	if !singleNodeMulti {
		pin(iAlphaR, paramFloor)
		pin(iBetaR, paramFloor)
	}
	if !moreThanTwo {
		pin(iBetaN, paramFloor)
		pin(iBetaR, paramFloor)
	}

	obj := newObjective(points, theta, pinned)
	x0 := obj.encode(theta)
	if len(x0) > 0 {
		res, err := optimize.Minimize(optimize.Problem{Func: obj.value, Grad: obj.gradient}, x0,
			&optimize.Settings{
				GradientThreshold: 1e-10,
				Converger:         &optimize.FunctionConverge{Absolute: 1e-12, Relative: 1e-12, Iterations: 20},
				MajorIterations:   1000,
			}, &optimize.BFGS{})
		// A line search that cannot improve any more near the optimum is
		// the common way for this to end (scipy reports it as success too):
		// take the best point found unless there is none.
		if res == nil || !finite(res.F) {
			if err == nil {
				err = errors.New("no finite objective")
			}
			return PerfParams{}, fmt.Errorf("goodput: fitting the throughput model: %w", err)
		}
		theta = obj.decode(res.X)
	}
	p := PerfParams{AlphaC: theta[iAlphaC], BetaC: theta[iBetaC], AlphaN: theta[iAlphaN], BetaN: theta[iBetaN],
		AlphaR: theta[iAlphaR], BetaR: theta[iBetaR], Gamma: theta[iGamma]}
	if !multiNode {
		p.AlphaN = math.Max(p.AlphaN, unseenPrior*p.AlphaR)
		p.BetaN = math.Max(p.BetaN, unseenPrior*p.BetaR)
	}
	return p, p.Validate()
}

// objective is Fit's loss over the free parameters, transformed.
type objective struct {
	theta  [nParams]float64 // the pinned values, and scratch for decoding
	free   []int            // indices of the free parameters, in x's order
	m      []float64        // micro-batch of each point
	retro  []float64        // max(K−2, 1e-8)
	link   []int8           // 0: single replica, 1: across nodes, 2: within a node
	logAcc []float64
	logOpt []float64
	// per-point scratch for the gradient
	acc, net, wAcc, rAcc, rOpt, logPred []float64
}

const (
	linkNone int8 = iota
	linkNodes
	linkReplicas
)

func newObjective(points []Point, theta [nParams]float64, pinned [nParams]bool) *objective {
	n := len(points)
	o := &objective{theta: theta}
	for i := range nParams {
		if !pinned[i] {
			o.free = append(o.free, i)
		}
	}
	buf := make([]float64, 10*n)
	next := func() []float64 { s := buf[:n:n]; buf = buf[n:]; return s }
	o.m, o.retro, o.logAcc, o.logOpt = next(), next(), next(), next()
	o.acc, o.net, o.wAcc, o.rAcc, o.rOpt, o.logPred = next(), next(), next(), next(), next(), next()
	o.link = make([]int8, n)
	for i, p := range points {
		o.m[i], o.retro[i] = float64(p.MicroBatch), retrogression(p.Replicas)
		o.logAcc[i], o.logOpt[i] = math.Log(p.AccumTime), math.Log(p.OptimTime)
		switch {
		case p.Nodes > 1:
			o.link[i] = linkNodes
		case p.Replicas > 1:
			o.link[i] = linkReplicas
		}
	}
	return o
}

// The transforms: a time is 1e-8 + u², γ is 1 + 9·sin²(v).
func (o *objective) encode(theta [nParams]float64) []float64 {
	x := make([]float64, len(o.free))
	for j, i := range o.free {
		if i == iGamma {
			x[j] = math.Asin(math.Sqrt((theta[i] - MinGamma) / (MaxGamma - MinGamma)))
		} else {
			x[j] = math.Sqrt(theta[i] - paramFloor)
		}
	}
	return x
}

func (o *objective) decode(x []float64) [nParams]float64 {
	theta := o.theta
	for j, i := range o.free {
		if i == iGamma {
			s := math.Sin(x[j])
			theta[i] = MinGamma + (MaxGamma-MinGamma)*s*s
		} else {
			theta[i] = paramFloor + x[j]*x[j]
		}
	}
	return theta
}

// rmseFloor keeps the RMSE differentiable at a perfect fit (it adds 1e-24 to
// the mean square: an error of 1e-12 in log time, far below any measurement).
const rmseFloor = 1e-24

func (o *objective) value(x []float64) float64 { return o.eval(x, nil) }

func (o *objective) gradient(grad, x []float64) { o.eval(x, grad) }

// eval returns the loss at x and, when grad is not nil, stores its gradient
// with respect to x there.
func (o *objective) eval(x, grad []float64) float64 {
	t := o.decode(x)
	n := float64(len(o.m))
	gamma := t[iGamma]
	var sAcc, sOpt float64
	for i := range o.m {
		acc := t[iAlphaC] + t[iBetaC]*o.m[i]
		a, b := paramFloor, paramFloor
		switch o.link[i] {
		case linkNodes:
			a, b = t[iAlphaN], t[iBetaN]
		case linkReplicas:
			a, b = t[iAlphaR], t[iBetaR]
		}
		net := a + b*o.retro[i]
		la, ln := math.Log(acc), math.Log(net)
		// log T̂_opt = log(acc^γ + net^γ)/γ = max + log1p(e^(−γ|la−ln|))/γ;
		// wAcc = acc^γ/(acc^γ + net^γ) is its derivative in la.
		var lp, w float64
		if la >= ln {
			e := math.Exp(-gamma * (la - ln))
			lp, w = la+math.Log1p(e)/gamma, 1/(1+e)
		} else {
			e := math.Exp(-gamma * (ln - la))
			lp, w = ln+math.Log1p(e)/gamma, e/(1+e)
		}
		o.acc[i], o.net[i], o.wAcc[i], o.logPred[i] = acc, net, w, lp
		o.rAcc[i], o.rOpt[i] = la-o.logAcc[i], lp-o.logOpt[i]
		sAcc += o.rAcc[i] * o.rAcc[i]
		sOpt += o.rOpt[i] * o.rOpt[i]
	}
	errAcc, errOpt := math.Sqrt(sAcc/n+rmseFloor), math.Sqrt(sOpt/n+rmseFloor)
	ratioN, ratioR := t[iBetaN]/t[iAlphaN], t[iBetaR]/t[iAlphaR]
	f := errAcc + errOpt + gammaReg*(gamma-1)*(gamma-1) + retrogressionReg*(ratioN*ratioN+ratioR*ratioR)
	if grad == nil {
		return f
	}

	var d [nParams]float64 // ∂f/∂θ
	for i := range o.m {
		gAcc := o.rAcc[i] / (n * errAcc) // ∂f/∂log T̂_acc
		gOpt := o.rOpt[i] / (n * errOpt) // ∂f/∂log T̂_opt
		w := o.wAcc[i]
		dAcc := (gAcc + gOpt*w) / o.acc[i]
		dNet := gOpt * (1 - w) / o.net[i]
		d[iAlphaC] += dAcc
		d[iBetaC] += dAcc * o.m[i]
		switch o.link[i] {
		case linkNodes:
			d[iAlphaN] += dNet
			d[iBetaN] += dNet * o.retro[i]
		case linkReplicas:
			d[iAlphaR] += dNet
			d[iBetaR] += dNet * o.retro[i]
		}
		la, ln := math.Log(o.acc[i]), math.Log(o.net[i])
		d[iGamma] += gOpt * (w*la + (1-w)*ln - o.logPred[i]) / gamma
	}
	d[iGamma] += 2 * gammaReg * (gamma - 1)
	d[iBetaN] += 2 * retrogressionReg * ratioN / t[iAlphaN]
	d[iAlphaN] -= 2 * retrogressionReg * ratioN * ratioN / t[iAlphaN]
	d[iBetaR] += 2 * retrogressionReg * ratioR / t[iAlphaR]
	d[iAlphaR] -= 2 * retrogressionReg * ratioR * ratioR / t[iAlphaR]
	for j, i := range o.free {
		if i == iGamma {
			grad[j] = d[i] * (MaxGamma - MinGamma) * math.Sin(2*x[j])
		} else {
			grad[j] = d[i] * 2 * x[j]
		}
	}
	return f
}

// Observation is one step as the sync layer measures it.
type Observation struct {
	Nodes, Replicas int
	MicroBatch      int // m, samples per replica per micro-batch
	Accum           int // s, extra micro-batches accumulated in the step
	// StepTime is the whole step, SyncTime the part of it spent waiting
	// for the gradient sync (seconds).
	StepTime, SyncTime float64
}

// profileKey is a configuration, as AdaptDL's profile keys it: steps with
// different accumulation share a key, their micro-batches cost the same.
type profileKey struct{ nodes, replicas, micro int }

type profileSums struct {
	accumTime  float64 // compute time of every micro-batch, summed
	accumCount int64   // micro-batches
	optimTime  float64 // time of every step's last micro-batch, summed
	optimCount int64   // steps
}

// Profile accumulates observed steps per configuration (nodes, replicas,
// micro-batch) into the points Fit takes. Each step's compute time (step
// minus sync) is spread evenly over its s+1 micro-batches; its last
// micro-batch's time is the step minus the s accumulated ones. The zero
// Profile is empty and ready; it is not safe for concurrent use.
type Profile struct {
	sums map[profileKey]*profileSums
	keys []profileKey // first-seen order, so Points is deterministic
}

// Add counts one step.
func (p *Profile) Add(o Observation) error {
	if o.Nodes < 1 || o.Replicas < o.Nodes || o.MicroBatch < 1 || o.Accum < 0 {
		return fmt.Errorf("goodput: observation needs 1 ≤ nodes ≤ replicas, a micro-batch ≥ 1 and accumulation ≥ 0, got %+v", o)
	}
	if !(o.StepTime > 0) || math.IsInf(o.StepTime, 0) || !(o.SyncTime >= 0) || o.SyncTime >= o.StepTime {
		return fmt.Errorf("goodput: observation needs 0 ≤ sync time < step time, both finite, got %v s of %v s", o.SyncTime, o.StepTime)
	}
	s := p.sumsOf(profileKey{o.Nodes, o.Replicas, o.MicroBatch})
	compute := o.StepTime - o.SyncTime
	perMicro := compute / float64(o.Accum+1)
	s.accumTime += compute
	s.accumCount += int64(o.Accum + 1)
	s.optimTime += o.StepTime - float64(o.Accum)*perMicro
	s.optimCount++
	return nil
}

// sumsOf returns k's sums, made empty where k is new.
func (p *Profile) sumsOf(k profileKey) *profileSums {
	if p.sums == nil {
		p.sums = map[profileKey]*profileSums{}
	}
	s := p.sums[k]
	if s == nil {
		s = &profileSums{}
		p.sums[k] = s
		p.keys = append(p.keys, k)
	}
	return s
}

// Len is the number of configurations seen.
func (p *Profile) Len() int { return len(p.keys) }

// MaxReplicas is the largest replica count seen (0 when empty): Pollux does
// not let a job go beyond twice it, where the model is extrapolating.
func (p *Profile) MaxReplicas() int {
	k := 0
	for _, key := range p.keys {
		k = max(k, key.replicas)
	}
	return k
}

// Points returns each configuration's mean times, in first-seen order.
func (p *Profile) Points() []Point {
	out := make([]Point, 0, len(p.keys))
	for _, k := range p.keys {
		s := p.sums[k]
		out = append(out, Point{Nodes: k.nodes, Replicas: k.replicas, MicroBatch: k.micro,
			AccumTime: s.accumTime / float64(s.accumCount), OptimTime: s.optimTime / float64(s.optimCount)})
	}
	return out
}

// Fit fits the throughput model to the profile (see the function Fit).
func (p *Profile) Fit() (PerfParams, error) { return Fit(p.Points()) }

// Reset forgets every observation.
func (p *Profile) Reset() { clear(p.sums); p.keys = p.keys[:0] }

// ProfileEntry is one configuration of a Profile with its sums, as a job's
// status records them (Profile.Entries) for the job's next driver to take
// over (Profile.AddEntry): a driver that replaces another fits to what the
// job was measured at before it, instead of starting as if the job were new.
type ProfileEntry struct {
	Nodes      int `json:"nodes"`
	Replicas   int `json:"replicas"`
	MicroBatch int `json:"microBatch"`
	// AccumTime is the compute time of every micro-batch, summed (seconds),
	// over AccumCount micro-batches; OptimTime the time of every step's last
	// micro-batch, summed, over OptimCount steps.
	AccumTime  float64 `json:"accumTime"`
	AccumCount int64   `json:"accumCount"`
	OptimTime  float64 `json:"optimTime"`
	OptimCount int64   `json:"optimCount"`
}

// Bounds of an entry AddEntry takes: a recorded profile comes from outside
// the process, and sums of larger counts could overflow.
const (
	maxEntryReplicas = 1 << 20
	maxEntryCount    = 1 << 40
	minEntryMean     = 1e-9 // a nanosecond: a mean time of 0 would leave the fit without a logarithm
	maxEntryMean     = 1e6
)

// meanInBounds says whether sum over count is a mean time AddEntry takes.
func meanInBounds(sum float64, count int64) bool {
	mean := sum / float64(count)
	return mean >= minEntryMean && mean <= maxEntryMean // false for NaN
}

// Entries returns each configuration with its sums, in first-seen order.
func (p *Profile) Entries() []ProfileEntry {
	if p == nil {
		return nil
	}
	out := make([]ProfileEntry, 0, len(p.keys))
	for _, k := range p.keys {
		s := p.sums[k]
		out = append(out, ProfileEntry{Nodes: k.nodes, Replicas: k.replicas, MicroBatch: k.micro,
			AccumTime: s.accumTime, AccumCount: s.accumCount, OptimTime: s.optimTime, OptimCount: s.optimCount})
	}
	return out
}

// AddEntry counts an entry's steps, as if each had been added: its sums go to
// its configuration's. An entry no run of Add could have made (a count below
// one, fewer micro-batches than steps, a mean time below a nanosecond, above
// a million seconds or not a number) is refused and changes nothing.
func (p *Profile) AddEntry(e ProfileEntry) error {
	switch {
	case e.Nodes < 1 || e.Replicas < e.Nodes || e.Replicas > maxEntryReplicas || e.MicroBatch < 1:
		return fmt.Errorf("goodput: profile entry needs 1 ≤ nodes ≤ replicas ≤ %d and a micro-batch ≥ 1, got %+v", maxEntryReplicas, e)
	case e.OptimCount < 1 || e.AccumCount < e.OptimCount || e.AccumCount > maxEntryCount:
		return fmt.Errorf("goodput: profile entry needs 1 ≤ steps ≤ micro-batches ≤ %d, got %d steps of %d micro-batches", int64(maxEntryCount), e.OptimCount, e.AccumCount)
	case !meanInBounds(e.AccumTime, e.AccumCount) || !meanInBounds(e.OptimTime, e.OptimCount):
		return fmt.Errorf("goodput: profile entry needs mean times of %v s to %v s, got %v s over %d micro-batches and %v s over %d steps",
			minEntryMean, maxEntryMean, e.AccumTime, e.AccumCount, e.OptimTime, e.OptimCount)
	}
	s := p.sumsOf(profileKey{e.Nodes, e.Replicas, e.MicroBatch})
	s.accumTime += e.AccumTime
	s.accumCount += e.AccumCount
	s.optimTime += e.OptimTime
	s.optimCount += e.OptimCount
	return nil
}

// Clone returns a profile with the same configurations and sums, which
// changes apart from p (an empty one for nil).
func (p *Profile) Clone() *Profile {
	c := &Profile{}
	if p == nil {
		return c
	}
	for _, k := range p.keys {
		*c.sumsOf(k) = *p.sums[k]
	}
	return c
}
