package collective

import (
	"context"
	"fmt"
)

// Allgather concatenates every rank's send buffer, in rank order, into recv on
// every rank: recv.Count must be Size()·send.Count.
func (c *Communicator) Allgather(ctx context.Context, send, recv Buffer) error {
	counts := make([]int, c.Size())
	for i := range counts {
		counts[i] = send.Count
	}
	return c.allgather(ctx, send, recv, counts, false)
}

// AllgatherV is Allgather with a different element count per rank: counts[i]
// elements come from rank i, and every rank must pass the same counts.
func (c *Communicator) AllgatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	return c.allgather(ctx, send, recv, counts, true)
}

func (c *Communicator) allgather(ctx context.Context, send, recv Buffer, counts []int, variable bool) error {
	p, r := c.Size(), c.Rank()
	// send may be recv's own block (in place), so no overlap check.
	if err := checkPair(send, recv); err != nil {
		return err
	}
	total, err := sumCounts("allgather", counts, p)
	if err != nil {
		return err
	}
	if counts[r] != send.Count {
		return fmt.Errorf("collective: counts[%d] is %d but the send buffer holds %d elements", r, counts[r], send.Count)
	}
	if recv.Count != total {
		return fmt.Errorf("collective: allgather of %d elements in all into a receive buffer of %d", total, recv.Count)
	}
	plan := newSegPlan(counts, send.DType.Size(), c.cfg.ChunkBytes)
	d := opDesc{coll: collAllgather, dtype: send.DType, count: uint64(total)}
	if variable {
		d.aux = layoutHash(counts)
	}
	return c.run(ctx, d, algoRing, func(ctx context.Context, o *opRun) error {
		dst := memOf(recv)
		off, n := plan.segment(r)
		if !(recv.Host != nil && n > 0 && &recv.Host[off] == &send.Host[0]) {
			if err := dst.copyFrom(ctx, off, memOf(send), 0, n); err != nil {
				return err
			}
		}
		if p == 1 {
			return nil
		}
		return o.ringAllgather(ctx, &plan, dst)
	})
}

// ringAllgather circulates every rank's segment of dst around the ring, chunk by
// chunk: step s forwards the segment received at step s-1, straight from dst.
func (o *opRun) ringAllgather(ctx context.Context, plan *segPlan, dst memory) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	right, left := (r+1)%p, (r-1+p)%p
	nc := plan.nchunks
	mod := func(x int) int { return ((x % p) + p) % p }
	scratch := c.scratchBuf(plan.maxChunk)
	staging := c.stagingFor(dst, plan.maxChunk)
	send := func(ctx context.Context, k int) error {
		off, n := plan.chunk(mod(r-k/nc), k%nc)
		b, err := dst.readable(ctx, off, n, staging)
		if err != nil {
			return err
		}
		return o.send(ctx, right, k, b)
	}
	recv := func(ctx context.Context, k int) error {
		off, n := plan.chunk(mod(r-k/nc-1), k%nc)
		b := dst.writable(off, n, scratch)
		if err := o.recv(ctx, left, k, b); err != nil {
			return err
		}
		return dst.commit(ctx, off, b)
	}
	items := (p - 1) * nc
	return o.pipeline(ctx, items, items, nc, 0, send, recv)
}
