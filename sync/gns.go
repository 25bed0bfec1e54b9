package sync

import (
	"encoding/json"
	"fmt"
	"math"
	stdsync "sync"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/heuristics/goodput"
	"github.com/gorovod/gorovod/internal/reduce"
)

// NoiseConfig configures the gradient noise measurement of a Session
// (Config.GradientNoise): AdaptDL's estimate of the gradient's square and
// variance (goodput.Estimator), from squared norms taken where the gradients
// pass, that the goodput heuristic and the adaptive batch size use.
type NoiseConfig struct {
	// Measure turns the measurement on. Every worker of a job must set it
	// alike: it adds a few elements to the gradient allreduce.
	Measure bool
	// InitBatch is M0, the global batch the statistics are scaled to (the
	// job's initial batch size); 0 takes the first measured step's.
	InitBatch int
	// Smoothing is the moving averages' decay per M0 samples; 0 means
	// goodput.DefaultSmoothing.
	Smoothing float64
}

// noiseBlob is the state name of the measurement's state: the estimator's
// averages and the side-car's scale, which every worker must hold alike.
const noiseBlob = "sync.gns"

// The side-car: the scalars each gradient allreduce carries besides the
// gradients (fusion.Fuser.AllreduceExtra), in one of its floating-point
// buckets. Slot xLocal carries each worker's squared norm of its local
// (micro-batch) gradients, scaled by the common power of two 2^-scaleExp
// so that it fits a float16 carrier; the allreduce sums them. The other
// slots carry the batch decision of rank 0 (see batchDecision) as base-16
// digits, zero on every other rank: a digit of at most 15, alone in its sum,
// survives any carrier dtype, scale factor and the division by the world
// size, and comes back as exactly the same integer on every rank.
const (
	xLocal      = 0
	xValid      = 1 // 1 when rank 0 sent a decision
	xMicro      = 2
	microDigits = 6
	xAccum      = xMicro + microDigits
	accumDigits = 3
	xLR         = xAccum + accumDigits
	lrDigits    = 8
	numExtras   = xLR + lrDigits
	// lrFraction is the fixed-point precision of the learning-rate factor:
	// a multiple of 2^-16.
	lrFraction = 16
	maxMicro   = 1<<(4*microDigits) - 1
	maxAccum   = 1<<(4*accumDigits) - 1
)

// batchDecision is what rank 0 decides for the next step and sends with a
// step's gradients: the micro-batch and accumulation (for the world the
// step ran in) and the learning-rate factor, a multiple of 2^-16.
type batchDecision struct {
	Micro, Accum int
	LRFactor     float64
}

// decider is a batch policy deciding through the side-car (AdaptiveBatch).
type decider interface {
	// propose is asked on rank 0 at the first gradient allreduce of each
	// step: the decision for the next step, given the newest gradient
	// statistics. It runs with the measurement locked and must not block.
	propose(grad goodput.GradParams, ready bool) (batchDecision, bool)
	// committed is called on every worker in Commit, before a new world
	// copies the state, with the step that committed.
	committed(c stepCommit)
}

// stepCommit is a committed step as the measurement hands it to the policy.
type stepCommit struct {
	Decision        batchDecision
	Decided         bool // the step carried a valid decision
	Global          int  // the step's global batch (0: not told)
	Rank, Replicas  int
	Elapsed, Waited time.Duration // the step's time and its time blocked on the others
	Grad            goodput.GradParams
	GradReady       bool
}

// gradNoise is a session's gradient noise measurement. Allreduce and
// AllreduceAsync call it around every gradient allreduce (before and after,
// which may run on the asynchronous goroutine), the training goroutine in
// Commit; the mutex orders them.
type gradNoise struct {
	mu  stdsync.Mutex
	cfg NoiseConfig
	est *goodput.Estimator // nil until M0 is known
	// scaleExp scales the side-car's squared norms by 2^-scaleExp, the
	// same on every worker (from the last measured step, in the state).
	scaleExp int
	dec      decider

	st noiseStep

	// The consecutive-steps estimate (one replica, one micro-batch per
	// step): the previous step's averaged gradient, kept tensor by tensor
	// in arena by the one pass that also takes its norm and inner product
	// (reduce.SumSquaresDotKeep*), its layout, and its squared norm.
	arena     []byte
	segs      []arenaSeg
	prevSegs  int // segments the previous step wrote
	prevOK    bool
	prevTotal float64
}

type arenaSeg struct {
	dt       collective.DType
	off, len int // bytes
}

// noiseStep is what one step measured so far.
type noiseStep struct {
	global      int     // the step's global batch (SetGlobalBatch)
	micro       int     // micro-batches recorded (RecordMicroBatch)
	microSqr    float64 // their squared norms, summed
	microSent   bool    // microSqr went with an allreduce
	proposed    bool
	proposal    batchDecision
	hasProposal bool
	calls       int     // allreduces that carried the side-car
	globalLocal float64 // Σ over workers of the local squared norms
	total       float64 // Σ over calls of the averaged gradient's squared norm
	localAlone  bool    // a world of one took no local norm: it is the total
	broken      bool    // some gradient could not be measured (device memory)
	decision    batchDecision
	decided     bool
	pairPos     int // arena segments this step
	prevDot     float64
	pairBroken  bool
}

func newGradNoise(cfg NoiseConfig) (*gradNoise, error) {
	if cfg.InitBatch < 0 {
		return nil, fmt.Errorf("%w: GradientNoise.InitBatch %d < 0", ErrInvalidConfig, cfg.InitBatch)
	}
	if cfg.Smoothing != 0 && !(cfg.Smoothing > 0 && cfg.Smoothing < 1) {
		return nil, fmt.Errorf("%w: GradientNoise.Smoothing %v is not in (0, 1)", ErrInvalidConfig, cfg.Smoothing)
	}
	g := &gradNoise{cfg: cfg}
	if cfg.InitBatch > 0 {
		if err := g.newEstimator(cfg.InitBatch); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func (g *gradNoise) newEstimator(initBatch int) error {
	est, err := goodput.NewEstimator(goodput.EstimatorConfig{InitBatch: initBatch, Smoothing: g.cfg.Smoothing})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	g.est, g.cfg.InitBatch = est, initBatch
	return nil
}

func (g *gradNoise) setDecider(d decider) {
	g.mu.Lock()
	g.dec = d
	g.mu.Unlock()
}

// params is the smoothed statistics; ready is false before the first
// estimate. Locked by the caller.
func (g *gradNoise) params() (goodput.GradParams, bool) {
	if g.est == nil || !g.est.Ready() {
		return goodput.GradParams{}, false
	}
	return g.est.Params(), true
}

// carries reports whether an allreduce with this reduction carries the
// side-car: sums and averages, whose results are the step's mean gradient.
func carries(how Reduction) bool { return how.Op == collective.Sum || how.Op == collective.Average }

// localFactor is what a worker's tensors are multiplied by to give its
// local mean gradient, the measurement assuming that the allreduce's result
// is the step's mean gradient: 1 for an Average without scales, the world
// size for a Sum of contributions each scaled by 1/Global.
func localFactor(how Reduction, size int) float64 {
	f := how.Prescale * how.Postscale
	if how.Op == collective.Sum {
		f *= float64(size)
	}
	return f
}

// before fills the side-car of one gradient allreduce on this worker. It
// returns false, and fills nothing, when the allreduce cannot carry it: a
// reduction other than a sum or an average, or no floating-point tensor in
// host memory (see fusion.Fuser.AllreduceExtra); the caller then reduces
// without it and calls uncarried.
func (g *gradNoise) before(tensors []collective.Buffer, how Reduction, rank, size int, x *[numExtras]float64) bool {
	if !carries(how) || !hasHostFloat(tensors) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var local float64
	switch {
	case g.st.micro > 0:
		// Accumulated: the recorded micro-batches, once per step.
		if !g.st.microSent {
			local, g.st.microSent = g.st.microSqr, true
		}
	case size == 1:
		// Alone, the allreduce returns the local gradient (times the
		// scales, which localFactor would apply): its norm, taken after,
		// is the local one too, and a pass over the gradient is saved.
		g.st.localAlone = true
	default:
		sq, ok := squaredNorm(tensors)
		if !ok {
			g.st.broken = true
		}
		f := localFactor(how, size)
		local = sq * f * f
	}
	x[xLocal] = math.Ldexp(local, -g.scaleExp)
	if rank == 0 && g.dec != nil {
		if !g.st.proposed {
			grad, ready := g.params()
			g.st.proposal, g.st.hasProposal = g.dec.propose(grad, ready)
			g.st.proposed = true
		}
		if g.st.hasProposal {
			encodeDecision(x, g.st.proposal)
		}
	}
	return true
}

// uncarried notes a gradient allreduce without the side-car: gradients in
// device memory, or reduced with another operation, leave the step
// unmeasured; integers alone are not gradients to measure.
func (g *gradNoise) uncarried(tensors []collective.Buffer) {
	for _, t := range tensors {
		if t.DType.IsFloat() {
			g.mu.Lock()
			g.st.broken = true
			g.mu.Unlock()
			return
		}
	}
}

// after takes the reduced side-car and the averaged gradient of one
// allreduce that carried it.
func (g *gradNoise) after(tensors []collective.Buffer, how Reduction, size int, x *[numExtras]float64) {
	// The collective scaled the side-car like the gradients: undo it.
	inv := 1 / (how.Prescale * how.Postscale)
	if how.Op == collective.Average {
		inv *= float64(size)
	}
	g.took(tensors, size, x, inv)
}

// afterAlone takes the averaged gradient of a world of one's allreduce,
// which did not carry the side-car: reduced alone, it would have come back
// as it went, scaled by what after undoes.
func (g *gradNoise) afterAlone(tensors []collective.Buffer, x *[numExtras]float64) {
	g.took(tensors, 1, x, 1)
}

// took is after's work once inv, what undoes the collective's scaling of the
// side-car, is known.
func (g *gradNoise) took(tensors []collective.Buffer, size int, x *[numExtras]float64, inv float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.st.calls++
	g.st.globalLocal += math.Ldexp(x[xLocal]*inv, g.scaleExp)
	var sq float64
	ok := true
	if size == 1 && g.st.micro <= 1 {
		sq, ok = g.keepForPair(tensors)
	} else {
		sq, ok = squaredNorm(tensors)
	}
	g.st.total += sq
	if g.st.localAlone {
		g.st.globalLocal += sq
	}
	if !ok {
		g.st.broken = true
	}
	if !g.st.decided {
		g.st.decision, g.st.decided = decodeDecision(x, inv)
	}
}

// keepForPair is the consecutive-steps estimate's pass over an averaged
// gradient: in one pass per tensor it returns the squared norm (as
// squaredNorm does), adds ⟨g_prev, g⟩ against the previous step's tensor,
// and keeps this step's tensor in its place.
func (g *gradNoise) keepForPair(tensors []collective.Buffer) (sq float64, ok bool) {
	ok = true
	for _, t := range tensors {
		if !t.DType.IsFloat() {
			continue
		}
		if t.Device != nil {
			ok = false
			continue
		}
		i := g.st.pairPos
		g.st.pairPos++
		off := 0
		if i > 0 {
			off = g.segs[i-1].off + g.segs[i-1].len
		}
		seg := arenaSeg{t.DType, off, len(t.Host)}
		if i >= len(g.segs) || g.segs[i] != seg || !g.prevOK {
			// A new layout: this step is kept, not paired.
			g.st.pairBroken = true
			g.segs = append(g.segs[:min(i, len(g.segs))], seg)
			if len(g.arena) < off+seg.len {
				g.arena = append(g.arena, make([]byte, off+seg.len-len(g.arena))...)
			}
		}
		s, dot := sumSquaresDotKeepOf(t.DType, t.Host, g.arena[off:off+seg.len])
		sq += s
		g.st.prevDot += dot
	}
	return sq, ok
}

// recordMicroBatch adds one micro-batch's squared norm.
func (g *gradNoise) recordMicroBatch(tensors []collective.Buffer) {
	sq, ok := squaredNorm(tensors)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !ok {
		g.st.broken = true
	}
	g.st.micro++
	g.st.microSqr += sq
}

// recordMicroBatchNorm adds one micro-batch's squared norm, taken by the
// trainer; one that is not a finite number ≥ 0 leaves the step unmeasured.
func (g *gradNoise) recordMicroBatchNorm(sq float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !(sq >= 0) || math.IsInf(sq, 0) {
		g.st.broken = true
	}
	g.st.micro++
	g.st.microSqr += sq
}

func (g *gradNoise) setGlobalBatch(n int) {
	g.mu.Lock()
	g.st.global = n
	g.mu.Unlock()
}

// commit ends the step on this worker: the estimator takes the step's
// norms, the policy the step. It returns what the step statistics report.
func (g *gradNoise) commit(rank, size int, elapsed, waited time.Duration) (accum int, grad goodput.GradParams) {
	g.mu.Lock()
	st := g.st
	g.st = noiseStep{}
	c := size * max(1, st.micro)
	// A world of one whose local norm is its total cannot have recorded
	// micro-batches after its allreduce.
	measured := !st.broken && !(st.localAlone && c > 1)
	if st.calls > 0 && measured && st.global >= c {
		if g.est == nil {
			_ = g.newEstimator(st.global) // st.global ≥ 1: cannot fail
		}
		n := goodput.StepNorms{Batch: st.global, MicroBatches: c, LocalSqr: st.globalLocal, TotalSqr: st.total}
		if c == 1 {
			n.HasPrev = g.prevOK && !st.pairBroken && st.pairPos == g.prevSegs
			n.PrevSqr, n.PrevDot = g.prevTotal, st.prevDot
		}
		// A non-finite or impossible step is skipped by the estimator.
		_, _ = g.est.Observe(n)
	}
	if v := st.globalLocal / float64(size*max(1, st.calls)); v > 0 && !math.IsInf(v, 0) && measured {
		_, g.scaleExp = math.Frexp(v)
	}
	g.prevOK = c == 1 && st.calls > 0 && st.pairPos > 0 && measured
	g.prevSegs, g.prevTotal = st.pairPos, st.total
	grad, ready := g.params()
	dec := g.dec
	g.mu.Unlock()
	if dec != nil {
		dec.committed(stepCommit{Decision: st.decision, Decided: st.decided, Global: st.global, Rank: rank, Replicas: size,
			Elapsed: elapsed, Waited: waited, Grad: grad, GradReady: ready})
	}
	return max(0, st.micro-1), grad
}

// reset forgets the step in progress and the previous step's gradient: the
// world changed, the step will be redone.
func (g *gradNoise) reset() {
	g.mu.Lock()
	g.st, g.prevOK = noiseStep{}, false
	g.mu.Unlock()
}

// noiseState is the measurement's part of the job's state.
type noiseState struct {
	InitBatch int                    `json:"init_batch"`
	Estimator goodput.EstimatorState `json:"estimator"`
	ScaleExp  int                    `json:"scale_exp"`
}

func (g *gradNoise) marshal() ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := noiseState{InitBatch: g.cfg.InitBatch, ScaleExp: g.scaleExp}
	if g.est != nil {
		s.Estimator = g.est.State()
	}
	return json.Marshal(s)
}

func (g *gradNoise) unmarshal(b []byte) error {
	var s noiseState
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("sync: gradient noise state: %w", err)
	}
	if s.InitBatch < 0 || s.ScaleExp < -1100 || s.ScaleExp > 1100 {
		return fmt.Errorf("sync: gradient noise state out of range: %+v", s)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.est = nil
	if s.InitBatch > 0 {
		if err := g.newEstimator(s.InitBatch); err != nil {
			return err
		}
		if err := g.est.Restore(s.Estimator); err != nil {
			return fmt.Errorf("sync: gradient noise state: %w", err)
		}
	}
	g.scaleExp, g.st, g.prevOK = s.ScaleExp, noiseStep{}, false
	return nil
}

// encodeDecision writes d's digits into the side-car.
func encodeDecision(x *[numExtras]float64, d batchDecision) {
	q := uint64(math.Round(math.Ldexp(d.LRFactor, lrFraction)))
	x[xValid] = 1
	putDigits(x[xMicro:xAccum], uint64(d.Micro))
	putDigits(x[xAccum:xLR], uint64(d.Accum))
	putDigits(x[xLR:numExtras], q)
}

func putDigits(x []float64, v uint64) {
	for i := range x {
		x[i] = float64(v >> (4 * i) & 15)
	}
}

// decodeDecision reads rank 0's decision back; inv undoes the collective's
// scaling. ok is false when no decision was sent or a digit did not come
// back an integer of 0 to 15 (a carrier too coarse for the scale factors).
func decodeDecision(x *[numExtras]float64, inv float64) (d batchDecision, ok bool) {
	valid, ok := getDigits(x[xValid:xMicro], inv)
	if !ok || valid != 1 {
		return d, false
	}
	m, ok1 := getDigits(x[xMicro:xAccum], inv)
	s, ok2 := getDigits(x[xAccum:xLR], inv)
	q, ok3 := getDigits(x[xLR:numExtras], inv)
	if !ok1 || !ok2 || !ok3 || m < 1 || q < 1 {
		return batchDecision{}, false
	}
	return batchDecision{Micro: int(m), Accum: int(s), LRFactor: math.Ldexp(float64(q), -lrFraction)}, true
}

func getDigits(x []float64, inv float64) (uint64, bool) {
	var v uint64
	for i, e := range x {
		d := e * inv
		r := math.Round(d)
		if !(math.Abs(d-r) < 0.25) || r < 0 || r > 15 {
			return 0, false
		}
		v |= uint64(r) << (4 * i)
	}
	return v, true
}

func hasHostFloat(tensors []collective.Buffer) bool {
	for _, t := range tensors {
		if t.Device == nil && t.DType.IsFloat() {
			return true
		}
	}
	return false
}

// squaredNorm is Σ‖t‖² over the host floating-point tensors; ok is false
// when a floating-point tensor is in device memory, whose norm is not taken
// here. Integer tensors are not gradients and are left out.
func squaredNorm(tensors []collective.Buffer) (sq float64, ok bool) {
	ok = true
	for _, t := range tensors {
		switch {
		case !t.DType.IsFloat():
		case t.Device != nil:
			ok = false
		default:
			sq += sumSquaresOf(t.DType, t.Host)
		}
	}
	return sq, ok
}

// sumSquaresOf is Σx² of the host bytes b holding elements of dtype dt.
func sumSquaresOf(dt collective.DType, b []byte) float64 {
	if len(b) == 0 {
		return 0
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	switch dt {
	case collective.Float32:
		return reduce.SumSquaresFloat32(unsafe.Slice((*float32)(p), len(b)/4))
	case collective.Float64:
		return reduce.SumSquaresFloat64(unsafe.Slice((*float64)(p), len(b)/8))
	case collective.Float16:
		return reduce.SumSquaresFloat16(unsafe.Slice((*uint16)(p), len(b)/2))
	case collective.BFloat16:
		return reduce.SumSquaresBFloat16(unsafe.Slice((*uint16)(p), len(b)/2))
	}
	return 0
}

// sumSquaresDotKeepOf is Σx² and Σx·y of the host bytes b and prev, of
// dtype dt and equal length, and then copies b over prev.
func sumSquaresDotKeepOf(dt collective.DType, b, prev []byte) (sq, dot float64) {
	if len(b) == 0 {
		return 0, 0
	}
	p, q := unsafe.Pointer(unsafe.SliceData(b)), unsafe.Pointer(unsafe.SliceData(prev))
	switch dt {
	case collective.Float32:
		return reduce.SumSquaresDotKeepFloat32(unsafe.Slice((*float32)(p), len(b)/4), unsafe.Slice((*float32)(q), len(prev)/4))
	case collective.Float64:
		return reduce.SumSquaresDotKeepFloat64(unsafe.Slice((*float64)(p), len(b)/8), unsafe.Slice((*float64)(q), len(prev)/8))
	case collective.Float16:
		return reduce.SumSquaresDotKeepFloat16(unsafe.Slice((*uint16)(p), len(b)/2), unsafe.Slice((*uint16)(q), len(prev)/2))
	case collective.BFloat16:
		return reduce.SumSquaresDotKeepBFloat16(unsafe.Slice((*uint16)(p), len(b)/2), unsafe.Slice((*uint16)(q), len(prev)/2))
	}
	return 0, 0
}
