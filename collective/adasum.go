package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gorovod/gorovod/internal/half"
)

// ErrNotPowerOfTwo is returned, before anything is sent, by an Adasum
// allreduce in a world whose size is not a power of two. Horovod refuses
// the same worlds; the communicator stays usable.
var ErrNotPowerOfTwo = errors.New("collective: Adasum needs a power-of-two number of ranks")

// Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
// Summation", MLSys 2021; Horovod's op=Adasum) combines two gradients a and
// b of one tensor as
//
//	(1 - a·b / (2|a|²)) a + (1 - a·b / (2|b|²)) b
//
// which is a + b for orthogonal vectors and their average for parallel ones.
// p ranks (a power of two) combine in log2 p levels, as Horovod's CPU
// implementation does: at level l (mask m = 2^l) rank r pairs with r^m, the
// lower rank's accumulated vector being the left one. The data moves by
// vector halving and distance doubling: at each level the pair splits the
// part of the buffer both hold, each keeps one half (the lower rank the
// first) and receives the partner's copy of it, so after log2 p levels each
// rank holds a 1/p slice, fully combined, which an allgather in reverse
// order (distance halving) hands to everyone. A tensor's dot product and
// norms at level l are spread over the 2m ranks that hold its pieces (those
// that share r's bits above l); each computes its piece's partial sums in
// float64 and the 2m ranks add them up by recursive doubling within their
// group, so the coefficients are those of the whole tensor. Each element of
// the result is computed by exactly one rank and copied to the others, so
// every rank ends with bit-identical results.
//
// A squared norm below sqrt of the smallest normal float64 counts as zero
// (its coefficient is 1), as in Horovod. Products and sums are computed in
// float64 and rounded once to the element type (through float32 with
// round-to-odd for float16 and bfloat16, which rounds as directly would).
// Prescale multiplies the input, Postscale the result (Horovod's order).

// adasumAllreduce is Allreduce with op Adasum: ro's options parsed, send and
// recv checked as a pair of the same count.
func (c *Communicator) adasumAllreduce(ctx context.Context, send, recv Buffer, ro reduceOptions) error {
	dt := send.DType
	if !dt.IsFloat() {
		return fmt.Errorf("collective: Adasum combines floating-point tensors (float32, float64, float16, bfloat16), not %v", dt)
	}
	p := c.Size()
	if p&(p-1) != 0 {
		return fmt.Errorf("%w (this world has %d)", ErrNotPowerOfTwo, p)
	}
	single := [1]int{send.Count}
	layout := ro.tensors
	if layout == nil {
		layout = single[:]
	}
	total := 0
	for i, n := range layout {
		if n < 0 {
			return fmt.Errorf("collective: Adasum tensor %d has a negative count %d", i, n)
		}
		total += n
	}
	if total != send.Count {
		return fmt.Errorf("collective: Adasum tensors of %d elements in all in a buffer of %d", total, send.Count)
	}
	d := opDesc{coll: collAllreduce, dtype: dt, op: Adasum, count: uint64(send.Count), aux: layoutHash(layout)}
	return c.runTagged(ctx, d, algoAdasum, ro.maxTag, func(ctx *opContext, o *opRun) error {
		work, err := c.adasumInput(ctx, send, recv)
		if err != nil {
			return err
		}
		if ro.prescale != 1 {
			if err := scaleHost(dt, work, ro.prescale, 1); err != nil {
				return err
			}
		}
		if p > 1 {
			if err := o.adasum(ctx, work, dt, layout); err != nil {
				return err
			}
		}
		if ro.postscale != 1 {
			if err := scaleHost(dt, work, ro.postscale, 1); err != nil {
				return err
			}
		}
		if recv.Device != nil {
			return recv.Device.CopyFromHost(ctx, 0, work)
		}
		return nil
	})
}

// adasumInput returns the host bytes Adasum works in, holding this rank's
// contribution: recv's own memory on the host; for device memory a host
// copy (the communicator's, reused), as Horovod's CPU Adasum copies device
// tensors to the host.
func (c *Communicator) adasumInput(ctx context.Context, send, recv Buffer) ([]byte, error) {
	if recv.Device == nil {
		if !sameMemory(send, recv) {
			copy(recv.Host, send.Host)
		}
		return recv.Host, nil
	}
	n := send.Bytes()
	c.adasumHost = resize(c.adasumHost, n)
	if err := send.Device.CopyToHost(ctx, c.adasumHost, 0); err != nil {
		return nil, err
	}
	return c.adasumHost, nil
}

// adasumRun is the state of one Adasum allreduce, kept by the communicator.
// Its exchanges (stepper) send out to peer and receive into in at step.
type adasumRun struct {
	o          *opRun
	out, in    []byte
	peer, step int
	// sums holds, per tensor, the dot product and the squared norms of the
	// left and the right vector (3 float64 each); theirs is a peer's.
	sums, theirs []float64
	// parents are the ranges this rank held before each level's split.
	parents []span
}

// span is a range of elements [lo, hi) of the fused buffer.
type span struct{ lo, hi int }

func (x *adasumRun) clear() {
	*x = adasumRun{o: x.o, sums: x.sums[:0], theirs: x.theirs[:0], parents: x.parents[:0]}
}

func (x *adasumRun) sendStep(ctx *opContext, _ int) error {
	return x.o.send(ctx, x.peer, x.step, x.out)
}

func (x *adasumRun) recvStep(ctx *opContext, _ int) error {
	return x.o.recv(ctx, x.peer, x.step, x.in)
}

// swap sends out to peer while receiving in from it, as frame step.
func (x *adasumRun) swap(ctx *opContext, peer, step int, out, in []byte) error {
	x.peer, x.step, x.out, x.in = peer, step, out, in
	return x.o.exchange(ctx, len(out), x)
}

// adasum combines buf (this rank's tensors of dt, laid out as layout says)
// with every other rank's, in place; the world's size is a power of two
// above 1. See the comment at the top of this file.
func (o *opRun) adasum(ctx *opContext, buf []byte, dt DType, layout []int) error {
	c := o.c
	x := &c.steps.adasum
	defer x.clear()
	p, r, es := c.Size(), c.Rank(), dt.Size()
	n := len(buf) / es
	partner := c.scratchBuf((n + 1) / 2 * es)
	x.sums, x.theirs = resize(x.sums, 3*len(layout)), resize(x.theirs, 3*len(layout))
	sums, theirs := asBytes(x.sums), asBytes(x.theirs)
	start, step := o.mark(), 0
	var reduce time.Duration
	lo, hi := 0, n
	for mask := 1; mask < p; mask <<= 1 {
		x.parents = append(x.parents, span{lo, hi})
		mid := lo + (hi-lo)/2
		left := r&mask == 0
		keep, give := span{lo, mid}, span{mid, hi}
		if !left {
			keep, give = give, keep
		}
		mine := buf[keep.lo*es : keep.hi*es]
		theirsHalf := partner[:len(mine)]
		if err := x.swap(ctx, r^mask, step, buf[give.lo*es:give.hi*es], theirsHalf); err != nil {
			return err
		}
		step++
		t := o.mark()
		adasumPartials(dt, layout, keep.lo, mine, theirsHalf, left, x.sums)
		reduce += o.mark() - t
		// The pieces of every tensor's left and right vectors lie on the
		// 2·mask ranks that share r's bits above this level.
		for m := 1; m <= mask; m <<= 1 {
			if err := x.swap(ctx, r^m, step, sums, theirs); err != nil {
				return err
			}
			step++
			for i, v := range x.theirs {
				x.sums[i] += v
			}
		}
		t = o.mark()
		adasumCombine(dt, layout, keep.lo, mine, theirsHalf, left, x.sums)
		reduce += o.mark() - t
		lo, hi = keep.lo, keep.hi
	}
	rsEnd := o.mark()
	for l := len(x.parents) - 1; l >= 0; l-- {
		mask, parent := 1<<l, x.parents[l]
		mid := parent.lo + (parent.hi-parent.lo)/2
		other := span{mid, parent.hi}
		if r&mask != 0 {
			other = span{parent.lo, mid}
		}
		if err := x.swap(ctx, r^mask, step, buf[lo*es:hi*es], buf[other.lo*es:other.hi*es]); err != nil {
			return err
		}
		step++
		lo, hi = parent.lo, parent.hi
	}
	if o.traced() {
		o.phase(PhaseReduceScatter, start, rsEnd, reduce)
		o.phase(PhaseAllgather, rsEnd, o.mark(), 0)
	}
	return nil
}

// adasumPartials writes into sums, for each tensor of layout, the partial
// sums over its elements within this rank's piece [lo, lo+len(mine)/size):
// the dot product of mine and theirs (the partner's values of the same
// elements), then the squared norm of the left vector's piece and of the
// right one's (mine is the left when left is true), all in float64. A
// tensor without elements in the piece gets zeros.
func adasumPartials(dt DType, layout []int, lo int, mine, theirs []byte, left bool, sums []float64) {
	es := dt.Size()
	hi := lo + len(mine)/es
	start := 0
	for t, count := range layout {
		a, b := max(start, lo), min(start+count, hi)
		var dot, mm, tt float64
		if a < b {
			dot, mm, tt = dotNorms(dt, mine[(a-lo)*es:(b-lo)*es], theirs[(a-lo)*es:(b-lo)*es])
		}
		sums[3*t] = dot
		if left {
			sums[3*t+1], sums[3*t+2] = mm, tt
		} else {
			sums[3*t+1], sums[3*t+2] = tt, mm
		}
		start += count
	}
}

// adasumCombine replaces mine (this rank's piece [lo, lo+len(mine)/size)
// of the buffer) with its Adasum combination with theirs, tensor by tensor,
// with the whole tensors' dot products and norms in sums.
func adasumCombine(dt DType, layout []int, lo int, mine, theirs []byte, left bool, sums []float64) {
	es := dt.Size()
	hi := lo + len(mine)/es
	start := 0
	for t, count := range layout {
		a, b := max(start, lo), min(start+count, hi)
		start += count
		if a >= b {
			continue
		}
		cl, cr := adasumCoefficients(sums[3*t], sums[3*t+1], sums[3*t+2])
		own, other := cl, cr
		if !left {
			own, other = cr, cl
		}
		scaledAdd(dt, mine[(a-lo)*es:(b-lo)*es], own, theirs[(a-lo)*es:(b-lo)*es], other)
	}
}

// minAdasumNormSq is the square root of the smallest normal float64: a
// squared norm below it counts as zero (Horovod's threshold), so a
// vanishing vector keeps coefficient 1 instead of dividing by nearly 0.
const minAdasumNormSq = 0x1p-511

// adasumCoefficients returns the coefficients of the left and the right
// vector, given their dot product and squared norms.
func adasumCoefficients(dot, leftSq, rightSq float64) (cl, cr float64) {
	cl, cr = 1, 1
	if leftSq >= minAdasumNormSq {
		cl = 1 - dot/leftSq*0.5
	}
	if rightSq >= minAdasumNormSq {
		cr = 1 - dot/rightSq*0.5
	}
	return cl, cr
}

// dotNorms returns a·b, a·a and b·b of two equally long runs of dt
// elements, accumulated in float64.
func dotNorms(dt DType, a, b []byte) (dot, aa, bb float64) {
	switch dt {
	case Float32:
		return dotNormsFloat(view[float32](a), view[float32](b))
	case Float64:
		return dotNormsFloat(view[float64](a), view[float64](b))
	case Float16:
		return dotNormsHalf(view[uint16](a), view[uint16](b), half.F16ToF32)
	case BFloat16:
		return dotNormsHalf(view[uint16](a), view[uint16](b), half.BF16ToF32)
	}
	return 0, 0, 0
}

func dotNormsFloat[T float32 | float64](a, b []T) (dot, aa, bb float64) {
	b = b[:len(a)]
	for i, v := range a {
		x, y := float64(v), float64(b[i])
		dot += x * y
		aa += x * x
		bb += y * y
	}
	return dot, aa, bb
}

func dotNormsHalf(a, b []uint16, widen func(uint16) float32) (dot, aa, bb float64) {
	b = b[:len(a)]
	for i, v := range a {
		x, y := float64(widen(v)), float64(widen(b[i]))
		dot += x * y
		aa += x * x
		bb += y * y
	}
	return dot, aa, bb
}

// scaledAdd sets a = ca·a + cb·b element-wise, computed in float64 and
// rounded once to dt.
func scaledAdd(dt DType, a []byte, ca float64, b []byte, cb float64) {
	switch dt {
	case Float32:
		x, y := view[float32](a), view[float32](b)
		y = y[:len(x)]
		for i, v := range x {
			x[i] = float32(float64(ca*float64(v)) + float64(cb*float64(y[i])))
		}
	case Float64:
		x, y := view[float64](a), view[float64](b)
		y = y[:len(x)]
		for i, v := range x {
			// The conversions keep the two products rounded apart (no
			// fused multiply-add), the same on every platform.
			x[i] = float64(ca*v) + float64(cb*y[i])
		}
	case Float16:
		scaledAddHalf(view[uint16](a), ca, view[uint16](b), cb, half.F16ToF32, half.F32ToF16)
	case BFloat16:
		scaledAddHalf(view[uint16](a), ca, view[uint16](b), cb, half.BF16ToF32, half.F32ToBF16)
	}
}

func scaledAddHalf(a []uint16, ca float64, b []uint16, cb float64, widen func(uint16) float32, narrow func(float32) uint16) {
	b = b[:len(a)]
	for i, v := range a {
		s := float64(ca*float64(widen(v))) + float64(cb*float64(widen(b[i])))
		a[i] = narrow(toOddFloat32(s))
	}
}

// toOddFloat32 rounds v to float32 with round-to-odd: truncated toward
// zero, with the last bit set when that was inexact. Rounding this to a
// format at least two bits narrower (float16, bfloat16) to nearest gives
// what rounding v there directly would; plain float32(v) first could round
// twice.
func toOddFloat32(v float64) float32 {
	f := float32(v)
	if float64(f) == v || math.IsNaN(v) {
		return f
	}
	if math.Abs(float64(f)) > math.Abs(v) {
		f = math.Nextafter32(f, 0)
	}
	return math.Float32frombits(math.Float32bits(f) | 1)
}
