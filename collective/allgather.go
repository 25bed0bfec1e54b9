package collective

import (
	"context"
	"fmt"
)

// Allgather concatenates every rank's send buffer, in rank order, into recv on
// every rank: recv.Count must be Size()·send.Count.
func (c *Communicator) Allgather(ctx context.Context, send, recv Buffer) error {
	return c.allgather(ctx, send, recv, nil, false)
}

// AllgatherV is Allgather with a different element count per rank: counts[i]
// elements come from rank i, and every rank must pass the same counts.
func (c *Communicator) AllgatherV(ctx context.Context, send, recv Buffer, counts []int) error {
	return c.allgather(ctx, send, recv, counts, true)
}

// allgather runs Allgather (variable false, counts nil: send.Count from every
// rank) and AllgatherV.
func (c *Communicator) allgather(ctx context.Context, send, recv Buffer, counts []int, variable bool) error {
	p, r := c.Size(), c.Rank()
	// send may be recv's own block (in place), so no overlap check.
	if err := checkPair(send, recv); err != nil {
		return err
	}
	total := p * send.Count
	if variable {
		var err error
		if total, err = sumCounts("allgather", counts, p); err != nil {
			return err
		}
		if counts[r] != send.Count {
			return fmt.Errorf("collective: counts[%d] is %d but the send buffer holds %d elements", r, counts[r], send.Count)
		}
	}
	if recv.Count != total {
		return fmt.Errorf("collective: allgather of %d elements in all into a receive buffer of %d", total, recv.Count)
	}
	d := opDesc{coll: collAllgather, dtype: send.DType, count: uint64(total)}
	if variable {
		d.aux = layoutHash(counts)
	}
	algo := c.allgatherAlgorithm()
	return c.run(ctx, d, algo, func(ctx *opContext, o *opRun) error {
		if !variable {
			// The communicator's own memory, which only the collective
			// holding opMu uses: no per-call allocation.
			counts = resize(c.counts, p)
			for i := range counts {
				counts[i] = send.Count
			}
			c.counts = counts
		}
		plan := &c.plan
		plan.set(counts, send.DType.Size(), c.cfg.ChunkBytes)
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
		if algo == algoHierarchical {
			return o.hierarchicalAllgather(ctx, counts, dst)
		}
		return o.ringAllgather(ctx, &c.grp.flat, plan, dst, 0)
	})
}

// ringAllgather circulates the segment of every position of g around the
// ring, chunk by chunk: step s forwards the segment received at step s-1,
// straight from dst. Its frames are numbered from stepBase.
func (o *opRun) ringAllgather(ctx *opContext, g *ringGroup, plan *segPlan, dst memory, stepBase int) error {
	return o.ringAllgatherOn(ctx, &o.c.lane, g, plan, dst, stepBase)
}

// ringAllgatherOn is ringAllgather on lane ln.
func (o *opRun) ringAllgatherOn(ctx *opContext, ln *lane, g *ringGroup, plan *segPlan, dst memory, stepBase int) error {
	p, r := g.size(), g.pos
	x := &ln.steps.gather
	defer x.clear()
	x.dst, x.plan, x.g, x.stepBase = dst, plan, g, stepBase
	x.p, x.r, x.right, x.left = p, r, g.ranks[(r+1)%p], g.ranks[(r-1+p)%p]
	x.scratch = ln.scratchBuf(plan.maxChunk)
	x.staging = ln.stagingFor(dst, plan.maxChunk)
	items := (p - 1) * plan.nchunks
	return o.pipelineOn(ctx, ln, items, items, plan.nchunks, 0, x)
}

// gatherRun is the state of one ring allgather, kept by the communicator:
// item k is chunk k%nc of the segment step k/nc forwards.
type gatherRun struct {
	o                *opRun
	dst              memory
	plan             *segPlan
	g                *ringGroup
	stepBase         int
	p, r             int
	right, left      int
	scratch, staging []byte
}

func (x *gatherRun) clear() { *x = gatherRun{o: x.o} }

func (x *gatherRun) mod(v int) int { return ((v % x.p) + x.p) % x.p }

func (x *gatherRun) sendStep(ctx *opContext, k int) error {
	nc := x.plan.nchunks
	off, n := x.plan.chunk(x.g.seg(x.mod(x.r-k/nc)), k%nc)
	b, err := x.dst.readable(ctx, off, n, x.staging)
	if err != nil {
		return err
	}
	return x.o.send(ctx, x.right, x.stepBase+k, b)
}

func (x *gatherRun) recvStep(ctx *opContext, k int) error {
	nc := x.plan.nchunks
	off, n := x.plan.chunk(x.g.seg(x.mod(x.r-k/nc-1)), k%nc)
	b := x.dst.writable(off, n, x.scratch)
	if err := x.o.recv(ctx, x.left, x.stepBase+k, b); err != nil {
		return err
	}
	return x.dst.commit(ctx, off, b)
}
