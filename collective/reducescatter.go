package collective

import (
	"context"
	"fmt"
)

// ReduceScatter reduces send across all ranks with op and leaves segment Rank()
// of the result in recv. The segments split send.Count as Horovod does: the first
// send.Count % Size() ranks get one element more.
func (c *Communicator) ReduceScatter(ctx context.Context, send, recv Buffer, op ReduceOp, opts ...Option) error {
	return c.reduceScatter(ctx, send, recv, nil, false, op, opts)
}

// ReduceScatterV is ReduceScatter with explicit segment sizes: rank i receives
// counts[i] elements, and every rank must pass the same counts.
func (c *Communicator) ReduceScatterV(ctx context.Context, send, recv Buffer, counts []int, op ReduceOp, opts ...Option) error {
	return c.reduceScatter(ctx, send, recv, counts, true, op, opts)
}

// reduceScatter runs ReduceScatter (variable false, counts nil: the even
// split) and ReduceScatterV.
func (c *Communicator) reduceScatter(ctx context.Context, send, recv Buffer, counts []int, variable bool, op ReduceOp, opts []Option) error {
	p, r := c.Size(), c.Rank()
	if err := checkReduce(op, send, recv); err != nil {
		return err
	}
	if !op.Elementwise() {
		return fmt.Errorf("collective: reducescatter cannot use %v, which combines whole tensors (allreduce only)", op)
	}
	mine := send.Count / p
	if r < send.Count%p {
		mine++
	}
	if variable {
		total, err := sumCounts("reducescatter", counts, p)
		if err != nil {
			return err
		}
		if total != send.Count {
			return fmt.Errorf("collective: counts add up to %d but the send buffer holds %d elements", total, send.Count)
		}
		mine = counts[r]
	}
	if recv.Count != mine {
		return fmt.Errorf("collective: rank %d receives %d elements but its receive buffer holds %d", r, mine, recv.Count)
	}
	ro, err := applyOptions(opts)
	if err != nil {
		return err
	}
	factor, divisor, err := finalScale(send.DType, op, ro.postscale, p)
	if err != nil {
		return err
	}
	d := opDesc{coll: collReduceScatter, dtype: send.DType, op: op, count: uint64(send.Count)}
	if variable {
		d.aux = layoutHash(counts)
	}
	return c.run(ctx, d, algoRing, func(ctx *opContext, o *opRun) error {
		if !variable {
			// The communicator's own memory, which only the collective
			// holding opMu uses: no per-call allocation.
			c.counts = evenCountsInto(c.counts, send.Count, p)
			counts = c.counts
		}
		plan := &c.plan
		plan.set(counts, send.DType.Size(), c.cfg.ChunkBytes)
		src, out := memOf(send), memOf(recv)
		myOff, myLen := plan.segment(r)
		if p == 1 {
			if err := out.copyFrom(ctx, 0, src, myOff, myLen); err != nil {
				return err
			}
			return out.scale(ctx, 0, myLen, send.DType, ro.prescale*factor, divisor)
		}
		// Partial sums of other ranks' segments need a home until forwarded.
		work, release, err := src.alloc(ctx, send.Bytes(), &c.work)
		if err != nil {
			return err
		}
		defer release()
		if ro.prescale != 1 {
			if err := work.copyFrom(ctx, 0, src, 0, send.Bytes()); err != nil {
				return err
			}
			if err := work.scale(ctx, 0, send.Bytes(), send.DType, ro.prescale, 1); err != nil {
				return err
			}
			src = work
		}
		return o.ring(ctx, &c.grp.flat, plan, src, work, out, -myOff, false, factor, divisor)
	})
}
