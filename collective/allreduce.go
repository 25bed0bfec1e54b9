package collective

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Option adjusts one reducing collective: Prescale, Postscale, MaxTag,
// Tensors or Staged. The zero Option changes nothing. An Option is a plain value, so
// passing options allocates nothing.
type Option struct {
	kind   optionKind
	factor float64
	tag    *uint64
	counts []int
}

type optionKind uint8

const (
	optPrescale optionKind = iota + 1
	optPostscale
	optMaxTag
	optTensors
	optStaged
)

type reduceOptions struct {
	prescale, postscale float64
	maxTag              *uint64
	tensors             []int
	staged              bool
}

// Prescale multiplies every rank's input by f before reducing (Horovod's
// prescale_factor).
func Prescale(f float64) Option { return Option{kind: optPrescale, factor: f} }

// Postscale multiplies the reduced result by f (Horovod's postscale_factor).
// With Average the division by the world size comes on top.
func Postscale(f float64) Option { return Option{kind: optPostscale, factor: f} }

// MaxTag makes an allreduce also agree on a number at no extra cost: *v goes
// in as this rank's value and comes out as the largest value of all ranks, the
// same on every rank. It rides in the frame headers of the allreduce's own data
// (every rank's frames reach every other rank, directly or relayed), so it
// sends no message of its own (except where a DeviceAllreducer takes the
// allreduce: then an allreduce of nothing after it carries the tag). The
// elastic layer uses it to learn, with each step's gradients, whether any
// worker knows of a newer world epoch.
func MaxTag(v *uint64) Option { return Option{kind: optMaxTag, tag: v} }

// Tensors says that an allreduce's buffer holds several tensors back to
// back, of counts[i] elements each (they must add up to the buffer's count,
// and every rank must pass the same counts). Only Adasum heeds it: it
// combines each tensor with its own dot product and norms, as it would if
// each were reduced alone, so fusing tensors into one buffer does not change
// the result. Without it the buffer is one tensor. The other ops work
// element by element and ignore it. The allreduce reads counts and keeps no
// reference to it.
func Tensors(counts []int) Option { return Option{kind: optTensors, counts: counts} }

func applyOptions(opts []Option) (reduceOptions, error) {
	o := reduceOptions{prescale: 1, postscale: 1}
	for _, opt := range opts {
		switch opt.kind {
		case optPrescale:
			o.prescale = opt.factor
		case optPostscale:
			o.postscale = opt.factor
		case optMaxTag:
			o.maxTag = opt.tag
		case optTensors:
			o.tensors = opt.counts
		case optStaged:
			o.staged = true
		}
	}
	for _, v := range []float64{o.prescale, o.postscale} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return o, fmt.Errorf("collective: scale factor %v is not finite", v)
		}
	}
	return o, nil
}

// finalScale is what the rank that finishes a reduction applies: the postscale
// factor and, for Average, the division by the world size — folded into the
// factor for floating-point types, an integer division otherwise. The
// collectives call it before sending anything, so that an average over no
// members fails there rather than in the middle of a reduction.
func finalScale(dt DType, op ReduceOp, post float64, p int) (factor float64, divisor int, err error) {
	if op != Average || p == 1 {
		return post, 1, nil
	}
	if p < 1 {
		return 0, 0, fmt.Errorf("collective: %v average over %d members", dt, p)
	}
	if dt.IsFloat() {
		return post / float64(p), 1, nil
	}
	return post, p, nil
}

func checkReduce(op ReduceOp, send, recv Buffer) error {
	if !op.Valid() {
		return unknownOp(op)
	}
	if err := checkPair(send, recv); err != nil {
		return err
	}
	return checkOverlap(send, recv)
}

// checkPair validates the send and receive buffers of one collective: each
// well formed, the same dtype, the same memory space.
func checkPair(send, recv Buffer) error {
	if err := send.validate("send"); err != nil {
		return err
	}
	if err := recv.validate("receive"); err != nil {
		return err
	}
	if send.DType != recv.DType {
		return fmt.Errorf("collective: send buffer is %v but receive buffer is %v", send.DType, recv.DType)
	}
	if (send.Device == nil) != (recv.Device == nil) {
		return fmt.Errorf("collective: send and receive buffers must both be host or both be device memory")
	}
	return nil
}

func checkOverlap(send, recv Buffer) error {
	if overlaps(send, recv) {
		return fmt.Errorf("collective: send and receive buffers overlap without being the same memory")
	}
	return nil
}

// sumCounts checks per-rank element counts and returns their total.
func sumCounts(what string, counts []int, p int) (int, error) {
	if len(counts) != p {
		return 0, fmt.Errorf("collective: %d %s counts for a world of %d ranks", len(counts), what, p)
	}
	total := 0
	for i, n := range counts {
		if n < 0 {
			return 0, fmt.Errorf("collective: negative %s count %d for rank %d", what, n, i)
		}
		total += n
	}
	return total, nil
}

// Allreduce reduces send across all ranks with op and leaves the result in recv
// on every rank. send and recv may be the same memory (in place). Every rank
// ends with bit-identical results.
//
// Adasum (adasum.go) combines the ranks' tensors pairwise instead of adding
// them, as Horovod's Adasum does: it needs a power-of-two number of ranks
// (ErrNotPowerOfTwo otherwise) and a floating-point dtype, and computes each
// tensor's dot products and norms separately when Tensors lays out several
// tensors in the buffer.
func (c *Communicator) Allreduce(ctx context.Context, send, recv Buffer, op ReduceOp, opts ...Option) error {
	if err := checkReduce(op, send, recv); err != nil {
		return err
	}
	if send.Count != recv.Count {
		return fmt.Errorf("collective: allreduce of %d elements into a buffer of %d", send.Count, recv.Count)
	}
	ro, err := applyOptions(opts)
	if err != nil {
		return err
	}
	if op == Adasum {
		return c.adasumAllreduce(ctx, send, recv, ro)
	}
	if c.devReduce != nil && !ro.staged && send.Device != nil && recv.Device != nil {
		if err := c.devReduce.AllreduceDevice(ctx, c, send, recv, op, ro.prescale, ro.postscale); err != nil {
			return err
		}
		if ro.maxTag != nil {
			// The tag has no frames of this collective to ride in: an
			// allreduce of nothing carries it (one small round of messages).
			none := Buffer{DType: Float32}
			return c.Allreduce(ctx, none, none, Max, MaxTag(ro.maxTag))
		}
		return nil
	}
	p := c.Size()
	factor, divisor, err := finalScale(send.DType, op, ro.postscale, p)
	if err != nil {
		return err
	}
	nbytes := send.Bytes()
	algo := c.allreduceAlgo(nbytes, send.Count)
	d := opDesc{coll: collAllreduce, dtype: send.DType, op: op, count: uint64(send.Count)}
	return c.runTagged(ctx, d, algo, ro.maxTag, func(ctx *opContext, o *opRun) error {
		src, dst := memOf(send), memOf(recv)
		if p == 1 || ro.prescale != 1 || algo == algoRecursiveDoubling || (algo == algoHierarchical && c.topo.LocalSize == 1) {
			// These start from the contribution in dst; the ring instead reads
			// an untouched source straight from send.
			if !sameMemory(send, recv) {
				if err := dst.copyFrom(ctx, 0, src, 0, nbytes); err != nil {
					return err
				}
			}
			if err := dst.scale(ctx, 0, nbytes, send.DType, ro.prescale, 1); err != nil {
				return err
			}
			src = dst
		}
		switch {
		case p == 1:
			return dst.scale(ctx, 0, nbytes, send.DType, factor, divisor)
		case algo == algoRecursiveDoubling:
			if err := o.recursiveDoubling(ctx, &c.grp.flat, dst, 0, nbytes, 0); err != nil {
				return err
			}
			return dst.scale(ctx, 0, nbytes, send.DType, factor, divisor)
		}
		if algo == algoHierarchical {
			return o.hierarchicalAllreduce(ctx, src, dst, send.Count, factor, divisor)
		}
		c.counts = evenCountsInto(c.counts, send.Count, p)
		c.plan.set(c.counts, send.DType.Size(), c.cfg.ChunkBytes)
		return o.ring(ctx, &c.grp.flat, &c.plan, src, dst, dst, 0, true, factor, divisor)
	})
}

// ring runs the pipelined ring over g: p-1 reduce-scatter steps and, with
// allgather, p-1 allgather steps (p the ranks of g), each segment cut into
// plan.nchunks chunks so that sending one chunk overlaps receiving and
// reducing the next, and reports its phases to the tracer.
//
// src holds this rank's contribution; intermediate sums land in work; the
// segment this rank finishes (the segment of its position in g) lands in out
// at byte offset plan offset + outShift, scaled by factor/divisor. For
// allreduce work and out are the destination; for reduce-scatter out is the
// receive buffer.
func (o *opRun) ring(ctx *opContext, g *ringGroup, plan *segPlan, src, work, out memory, outShift int, allgather bool, factor float64, divisor int) error {
	start := o.mark()
	rr, err := o.ringSteps(ctx, &o.c.lane, g, plan, ringMem{src: src, work: work, out: out, outShift: outShift}, allgather, factor, divisor, 0)
	if rr.rsEnd > 0 {
		o.phase(PhaseReduceScatter, start, rr.rsEnd, rr.reduce)
		if allgather {
			o.phase(PhaseAllgather, rr.rsEnd, o.mark(), 0)
		}
	}
	return err
}

// ringMem is where a ring works: src, work and out as for ring, each at byte
// offset base (plus outShift for out).
type ringMem struct {
	src, work, out memory
	base, outShift int
}

// ringSteps runs the ring of ring (which see) on lane ln without reporting
// phases; its frames are numbered from stepBase. It returns the traced times.
func (o *opRun) ringSteps(ctx *opContext, ln *lane, g *ringGroup, plan *segPlan, m ringMem, allgather bool, factor float64, divisor int, stepBase int) (times ringTimes, err error) {
	p, r := g.size(), g.pos
	rr := &ln.steps.ring
	defer rr.clear()
	rr.plan, rr.src, rr.work, rr.out, rr.outShift = plan, m.src, m.work, m.out, m.base+m.outShift
	rr.base, rr.stepBase, rr.g = m.base, stepBase, g
	rr.p, rr.r, rr.right, rr.left = p, r, g.ranks[(r+1)%p], g.ranks[(r-1+p)%p]
	rr.nc, rr.rsSteps = plan.nchunks, p-1
	rr.dt, rr.op = o.desc.dtype, kernelReduceOp(o.desc.op)
	rr.factor, rr.divisor = factor, divisor
	rr.scratch = ln.scratchBuf(plan.maxChunk)
	rr.staging = ln.stagingFor(m.src, plan.maxChunk)
	rr.reduce, rr.rsEnd = 0, 0
	steps := rr.rsSteps
	if allgather {
		steps += p - 1
	}
	// Reduce-scatter step s sends the segment reduced at step s-1 and receives
	// the next; allgather step t forwards the segment received at step t-1,
	// starting with the one this rank finished. So chunk j of step s always
	// waits for chunk j of step s-1: a lag of nc items.
	//
	// An allgather receive overwrites the segment that the send p-1 steps
	// earlier read. The ring's own data dependency already orders them
	// (that receive needs data that has been around the ring since that
	// send), but only through the links, which the race detector cannot see
	// through a socket; the guard says it in Go.
	items := steps * rr.nc
	err = o.pipelineOn(ctx, ln, items, items, rr.nc, (p-1)*rr.nc, rr)
	return ringTimes{reduce: rr.reduce, rsEnd: rr.rsEnd}, err
}

// ringTimes is what a traced ring measured: time in reduce kernels, and when
// its reduce-scatter half ended (0 when untraced).
type ringTimes struct{ reduce, rsEnd time.Duration }

// ringRun is the state of one ring (opRun.ring), kept by the communicator.
type ringRun struct {
	o              *opRun
	g              *ringGroup
	plan           *segPlan
	src, work, out memory
	// base is src's and work's byte offset of the plan, outShift out's;
	// stepBase numbers the ring's first frame.
	base, outShift   int
	stepBase         int
	p, r             int
	right, left      int
	nc, rsSteps      int
	dt               DType
	op               ReduceOp
	factor           float64
	divisor          int
	scratch, staging []byte
	// Traced: time in reduce kernels, and when the reduce-scatter half ended
	// on the receiving side (which does the reducing).
	reduce, rsEnd time.Duration
	// Reduce-scatter chunks are reduced where they land (a shared-memory
	// ring, see transport.InPlaceLink): piece by piece, src's bytes op the
	// piece into rs.into. One consumer (consumeFn, rr.consume made once)
	// serves every chunk; rs says where the current one goes.
	rs struct {
		ctx  *opContext
		into memory
		off  int // into's offset of the chunk
		sOff int // src's offset of the chunk
	}
	consumeFn func(off int, piece []byte) error
}

// clear drops the references to the collective's memory, so that the
// communicator does not keep the caller's buffers alive.
func (rr *ringRun) clear() {
	*rr = ringRun{o: rr.o, consumeFn: rr.consumeFn}
}

func (rr *ringRun) mod(x int) int { return ((x % rr.p) + rr.p) % rr.p }

// sendSeg and recvSeg are the plan segments step s sends and receives: the
// segments of the ring positions counted back from this rank's.
func (rr *ringRun) sendSeg(s int) int {
	if s < rr.rsSteps {
		return rr.g.seg(rr.mod(rr.r - s - 1))
	}
	return rr.g.seg(rr.mod(rr.r - (s - rr.rsSteps)))
}

func (rr *ringRun) recvSeg(s int) int {
	if s < rr.rsSteps {
		return rr.g.seg(rr.mod(rr.r - s - 2))
	}
	return rr.g.seg(rr.mod(rr.r - (s - rr.rsSteps) - 1))
}

func (rr *ringRun) consume(po int, piece []byte) error {
	if len(piece)%rr.dt.Size() != 0 {
		return fmt.Errorf("collective: transport handed over %d bytes, not whole %v elements", len(piece), rr.dt)
	}
	o := rr.o
	t := o.mark()
	err := rr.rs.into.reduceFrom(rr.rs.ctx, rr.rs.off+po, rr.src, rr.rs.sOff+po, piece, rr.dt, rr.op)
	if o.traced() {
		rr.reduce += o.mark() - t
	}
	return err
}

func (rr *ringRun) sendStep(ctx *opContext, k int) error {
	s, j := k/rr.nc, k%rr.nc
	off, n := rr.plan.chunk(rr.sendSeg(s), j)
	from, fromOff := rr.work, off+rr.base
	switch {
	case s == 0:
		from = rr.src
	case s == rr.rsSteps:
		from, fromOff = rr.out, off+rr.outShift
	}
	b, err := from.readable(ctx, fromOff, n, rr.staging)
	if err != nil {
		return err
	}
	if s < rr.rsSteps {
		return rr.o.sendInPlace(ctx, rr.right, rr.stepBase+k, b)
	}
	return rr.o.send(ctx, rr.right, rr.stepBase+k, b)
}

func (rr *ringRun) recvStep(ctx *opContext, k int) error {
	o := rr.o
	s, j := k/rr.nc, k%rr.nc
	off, n := rr.plan.chunk(rr.recvSeg(s), j)
	if s >= rr.rsSteps {
		b := rr.work.writable(off+rr.base, n, rr.scratch)
		if err := o.recv(ctx, rr.left, rr.stepBase+k, b); err != nil {
			return err
		}
		return rr.work.commit(ctx, off+rr.base, b)
	}
	rr.rs.ctx, rr.rs.into, rr.rs.off, rr.rs.sOff = ctx, rr.work, off+rr.base, off+rr.base
	if s == rr.rsSteps-1 {
		rr.rs.into, rr.rs.off = rr.out, off+rr.outShift
	}
	if err := o.recvInPlace(ctx, rr.left, rr.stepBase+k, rr.scratch[:n], rr.consumeFn); err != nil {
		return err
	}
	var err error
	if s == rr.rsSteps-1 {
		t := o.mark()
		err = rr.out.scale(ctx, off+rr.outShift, n, rr.dt, rr.factor, rr.divisor)
		if o.traced() {
			rr.reduce += o.mark() - t
		}
	}
	if o.traced() && k == rr.rsSteps*rr.nc-1 {
		rr.rsEnd = o.mark()
	}
	return err
}

// recursiveDoubling allreduces nbytes of buf at byte offset base (holding
// this rank's contribution) among the ranks of g in ceil(log2 p) exchanges of
// the whole buffer: the latency-optimal choice for small messages. With p not
// a power of two, the first 2·rem positions pair up first so that a power of
// two takes part, and the odd ones hand the result back at the end. Partners
// combine the same two values, so all ranks end bit-identical. Its frames are
// numbered from stepBase.
func (o *opRun) recursiveDoubling(ctx *opContext, g *ringGroup, buf memory, base, nbytes, stepBase int) error {
	return o.recursiveDoublingOn(ctx, &o.c.lane, g, buf, base, nbytes, stepBase)
}

// doublingSteps is how many frame numbers a recursive doubling among p ranks
// uses from its stepBase.
func doublingSteps(p int) int {
	rounds := 0
	for m := 1; m*2 <= p; m <<= 1 {
		rounds++
	}
	return rounds + 2
}

// recursiveDoublingOn is recursiveDoubling on lane ln.
func (o *opRun) recursiveDoublingOn(ctx *opContext, ln *lane, g *ringGroup, buf memory, base, nbytes, stepBase int) error {
	p, r := g.size(), g.pos
	dt, op := o.desc.dtype, kernelReduceOp(o.desc.op)
	pof2 := 1
	for pof2*2 <= p {
		pof2 *= 2
	}
	rem := p - pof2
	x := &ln.steps.doubling
	defer x.clear()
	x.buf, x.base, x.nbytes = buf, base, nbytes
	x.scratch = ln.scratchBuf(nbytes)[:nbytes]
	x.staging = ln.stagingFor(buf, nbytes)
	combine := func(ctx context.Context) error {
		return buf.reduceFrom(ctx, base, buf, base, x.scratch, dt, op)
	}
	rounds := 0
	for m := 1; m < pof2; m <<= 1 {
		rounds++
	}
	newRank := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := x.sendAll(ctx, g.ranks[r+1], stepBase); err != nil {
				return err
			}
			newRank = -1
		} else {
			if err := o.recv(ctx, g.ranks[r-1], stepBase, x.scratch); err != nil {
				return err
			}
			if err := combine(ctx); err != nil {
				return err
			}
			newRank = r / 2
		}
	}
	if newRank >= 0 {
		x.step = stepBase + 1
		for mask := 1; mask < pof2; mask <<= 1 {
			pn := newRank ^ mask
			x.peer = g.ranks[pn+rem]
			if pn < rem {
				x.peer = g.ranks[pn*2+1]
			}
			if err := o.exchangeOn(ctx, ln, nbytes, x); err != nil {
				return err
			}
			if err := combine(ctx); err != nil {
				return err
			}
			x.step++
		}
	}
	if r < 2*rem {
		last := stepBase + rounds + 1
		if r%2 == 1 {
			return x.sendAll(ctx, g.ranks[r-1], last)
		}
		b := buf.writable(base, nbytes, x.scratch)
		if err := o.recv(ctx, g.ranks[r+1], last, b); err != nil {
			return err
		}
		return buf.commit(ctx, base, b)
	}
	return nil
}

// doublingRun is the state of one recursive doubling, kept by the
// communicator: its exchanges (stepper) swap the whole buffer (nbytes at
// base) with peer at step.
type doublingRun struct {
	o                *opRun
	buf              memory
	base, nbytes     int
	scratch, staging []byte
	peer, step       int
}

func (x *doublingRun) clear() { *x = doublingRun{o: x.o} }

func (x *doublingRun) sendAll(ctx context.Context, to, step int) error {
	b, err := x.buf.readable(ctx, x.base, x.nbytes, x.staging)
	if err != nil {
		return err
	}
	return x.o.send(ctx, to, step, b)
}

func (x *doublingRun) sendStep(ctx *opContext, _ int) error { return x.sendAll(ctx, x.peer, x.step) }

func (x *doublingRun) recvStep(ctx *opContext, _ int) error {
	return x.o.recv(ctx, x.peer, x.step, x.scratch)
}

// kernelReduceOp maps Average to the Sum its kernels run.
func kernelReduceOp(op ReduceOp) ReduceOp {
	if op == Average {
		return Sum
	}
	return op
}
