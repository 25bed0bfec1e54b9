package collective

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Option adjusts one reducing collective.
type Option func(*reduceOptions)

type reduceOptions struct {
	prescale, postscale float64
	maxTag              *uint64
}

// Prescale multiplies every rank's input by f before reducing (Horovod's
// prescale_factor).
func Prescale(f float64) Option { return func(o *reduceOptions) { o.prescale = f } }

// Postscale multiplies the reduced result by f (Horovod's postscale_factor).
// With Average the division by the world size comes on top.
func Postscale(f float64) Option { return func(o *reduceOptions) { o.postscale = f } }

// MaxTag makes an allreduce also agree on a number at no extra cost: *v goes
// in as this rank's value and comes out as the largest value of all ranks, the
// same on every rank. It rides in the frame headers of the allreduce's own data
// (every rank's frames reach every other rank, directly or relayed), so it
// sends no message of its own. The elastic layer uses it to learn, with each
// step's gradients, whether any worker knows of a newer world epoch.
func MaxTag(v *uint64) Option { return func(o *reduceOptions) { o.maxTag = v } }

func applyOptions(opts []Option) (reduceOptions, error) {
	o := reduceOptions{prescale: 1, postscale: 1}
	for _, f := range opts {
		f(&o)
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
// factor for floating-point types, an integer division otherwise.
func finalScale(dt DType, op ReduceOp, post float64, p int) (factor float64, divisor int) {
	if op != Average || p == 1 {
		return post, 1
	}
	if dt.IsFloat() {
		return post / float64(p), 1
	}
	return post, p
}

func checkReduce(op ReduceOp, send, recv Buffer) error {
	if !op.Valid() {
		return fmt.Errorf("collective: invalid reduce op %v", op)
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
	p := c.Size()
	nbytes := send.Bytes()
	algo := algoRing
	if nbytes <= c.cfg.SmallMessageBytes || send.Count < p {
		algo = algoRecursiveDoubling
	}
	d := opDesc{coll: collAllreduce, dtype: send.DType, op: op, count: uint64(send.Count)}
	return c.runTagged(ctx, d, algo, ro.maxTag, func(ctx context.Context, o *opRun) error {
		src, dst := memOf(send), memOf(recv)
		factor, divisor := finalScale(send.DType, op, ro.postscale, p)
		if p == 1 || ro.prescale != 1 || algo == algoRecursiveDoubling {
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
			if err := o.recursiveDoubling(ctx, dst, nbytes); err != nil {
				return err
			}
			return dst.scale(ctx, 0, nbytes, send.DType, factor, divisor)
		}
		plan := newSegPlan(evenCounts(send.Count, p), send.DType.Size(), c.cfg.ChunkBytes)
		return o.ring(ctx, &plan, src, dst, dst, 0, true, factor, divisor)
	})
}

// ring runs the pipelined ring: p-1 reduce-scatter steps and, with allgather,
// p-1 allgather steps, each segment cut into plan.nchunks chunks so that sending
// one chunk overlaps receiving and reducing the next.
//
// src holds this rank's contribution; intermediate sums land in work; the
// segment this rank finishes (segment Rank) lands in out at byte offset
// plan offset + outShift, scaled by factor/divisor. For allreduce work and out
// are the destination; for reduce-scatter out is the receive buffer.
func (o *opRun) ring(ctx context.Context, plan *segPlan, src, work, out memory, outShift int, allgather bool, factor float64, divisor int) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	right, left := (r+1)%p, (r-1+p)%p
	nc := plan.nchunks
	rsSteps := p - 1
	steps := rsSteps
	if allgather {
		steps += p - 1
	}
	mod := func(x int) int { return ((x % p) + p) % p }
	// Reduce-scatter step s sends the segment reduced at step s-1 and receives the
	// next; allgather step t forwards the segment received at step t-1, starting
	// with the one this rank finished. So chunk j of step s always waits for
	// chunk j of step s-1: a lag of nc items.
	sendSeg := func(s int) int {
		if s < rsSteps {
			return mod(r - s - 1)
		}
		return mod(r - (s - rsSteps))
	}
	recvSeg := func(s int) int {
		if s < rsSteps {
			return mod(r - s - 2)
		}
		return mod(r - (s - rsSteps) - 1)
	}
	dt, op := o.desc.dtype, kernelReduceOp(o.desc.op)
	scratch := c.scratchBuf(plan.maxChunk)
	staging := c.stagingFor(src, plan.maxChunk)
	// Traced: time in reduce kernels, and when the reduce-scatter half ended
	// on the receiving side (which does the reducing).
	var reduce, rsEnd time.Duration
	// Reduce-scatter chunks are reduced where they land (a shared-memory ring,
	// see transport.InPlaceLink): piece by piece, src's bytes op the piece into
	// rs.into. One consumer serves every chunk; rs says where the current one goes.
	var rs struct {
		ctx  context.Context
		into memory
		off  int // into's offset of the chunk
		sOff int // src's offset of the chunk
	}
	esz := dt.Size()
	consume := func(po int, piece []byte) error {
		if len(piece)%esz != 0 {
			return fmt.Errorf("collective: transport handed over %d bytes, not whole %v elements", len(piece), dt)
		}
		t := o.mark()
		err := rs.into.reduceFrom(rs.ctx, rs.off+po, src, rs.sOff+po, piece, dt, op)
		if o.traced() {
			reduce += o.mark() - t
		}
		return err
	}
	send := func(ctx context.Context, k int) error {
		s, j := k/nc, k%nc
		off, n := plan.chunk(sendSeg(s), j)
		from, fromOff := work, off
		switch {
		case s == 0:
			from = src
		case s == rsSteps:
			from, fromOff = out, off+outShift
		}
		b, err := from.readable(ctx, fromOff, n, staging)
		if err != nil {
			return err
		}
		if s < rsSteps {
			return o.sendInPlace(ctx, right, k, b)
		}
		return o.send(ctx, right, k, b)
	}
	recv := func(ctx context.Context, k int) error {
		s, j := k/nc, k%nc
		off, n := plan.chunk(recvSeg(s), j)
		if s >= rsSteps {
			b := work.writable(off, n, scratch)
			if err := o.recv(ctx, left, k, b); err != nil {
				return err
			}
			return work.commit(ctx, off, b)
		}
		rs.ctx, rs.into, rs.off, rs.sOff = ctx, work, off, off
		if s == rsSteps-1 {
			rs.into, rs.off = out, off+outShift
		}
		if err := o.recvInPlace(ctx, left, k, scratch[:n], consume); err != nil {
			return err
		}
		var err error
		if s == rsSteps-1 {
			t := o.mark()
			err = out.scale(ctx, off+outShift, n, dt, factor, divisor)
			if o.traced() {
				reduce += o.mark() - t
			}
		}
		if o.traced() && k == rsSteps*nc-1 {
			rsEnd = o.mark()
		}
		return err
	}
	// An allgather receive overwrites the segment that the send p-1 steps
	// earlier read. The ring's own data dependency already orders them
	// (that receive needs data that has been around the ring since that
	// send), but only through the links, which the race detector cannot see
	// through a socket; the guard says it in Go.
	items := steps * nc
	start := o.mark()
	err := o.pipeline(ctx, items, items, nc, (p-1)*nc, send, recv)
	if rsEnd > 0 {
		o.phase(PhaseReduceScatter, start, rsEnd, reduce)
		if allgather {
			o.phase(PhaseAllgather, rsEnd, o.mark(), 0)
		}
	}
	return err
}

// recursiveDoubling allreduces buf (holding this rank's contribution) in
// ceil(log2 p) exchanges of the whole buffer: the latency-optimal choice for small
// messages. With p not a power of two, the first 2·rem ranks pair up first so that
// a power of two takes part, and the odd ones hand the result back at the end.
// Partners combine the same two values, so all ranks end bit-identical.
func (o *opRun) recursiveDoubling(ctx context.Context, buf memory, nbytes int) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	dt, op := o.desc.dtype, kernelReduceOp(o.desc.op)
	pof2 := 1
	for pof2*2 <= p {
		pof2 *= 2
	}
	rem := p - pof2
	scratch := c.scratchBuf(nbytes)[:nbytes]
	staging := c.stagingFor(buf, nbytes)
	sendAll := func(ctx context.Context, to, step int) error {
		b, err := buf.readable(ctx, 0, nbytes, staging)
		if err != nil {
			return err
		}
		return o.send(ctx, to, step, b)
	}
	combine := func(ctx context.Context) error {
		return buf.reduceFrom(ctx, 0, buf, 0, scratch, dt, op)
	}
	rounds := 0
	for m := 1; m < pof2; m <<= 1 {
		rounds++
	}
	newRank := r - rem
	if r < 2*rem {
		if r%2 == 0 {
			if err := sendAll(ctx, r+1, 0); err != nil {
				return err
			}
			newRank = -1
		} else {
			if err := o.recv(ctx, r-1, 0, scratch); err != nil {
				return err
			}
			if err := combine(ctx); err != nil {
				return err
			}
			newRank = r / 2
		}
	}
	if newRank >= 0 {
		step := 1
		for mask := 1; mask < pof2; mask <<= 1 {
			pn := newRank ^ mask
			peer := pn + rem
			if pn < rem {
				peer = pn*2 + 1
			}
			err := o.exchange(ctx, nbytes,
				func(ctx context.Context) error { return sendAll(ctx, peer, step) },
				func(ctx context.Context) error { return o.recv(ctx, peer, step, scratch) })
			if err != nil {
				return err
			}
			if err := combine(ctx); err != nil {
				return err
			}
			step++
		}
	}
	if r < 2*rem {
		last := rounds + 1
		if r%2 == 1 {
			return sendAll(ctx, r-1, last)
		}
		b := buf.writable(0, nbytes, scratch)
		if err := o.recv(ctx, r+1, last, b); err != nil {
			return err
		}
		return buf.commit(ctx, 0, b)
	}
	return nil
}

// kernelReduceOp maps Average to the Sum its kernels run.
func kernelReduceOp(op ReduceOp) ReduceOp {
	if op == Average {
		return Sum
	}
	return op
}
