package collective

import (
	"context"
	"fmt"
)

// Alltoall sends block j of send to rank j and receives block i of recv from rank
// i; send.Count and recv.Count must both be divisible by Size() and equal.
func (c *Communicator) Alltoall(ctx context.Context, send, recv Buffer) error {
	p := c.Size()
	if send.Count%p != 0 || recv.Count != send.Count {
		return fmt.Errorf("collective: alltoall needs equal send and receive counts divisible by %d ranks, got %d and %d", p, send.Count, recv.Count)
	}
	return c.alltoall(ctx, send, nil, recv, nil)
}

// AlltoallV sends sendCounts[j] elements to rank j, in rank order from send, and
// receives recvCounts[i] elements from rank i, in rank order into recv. Rank i's
// sendCounts[j] must equal rank j's recvCounts[i].
func (c *Communicator) AlltoallV(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) error {
	p := c.Size()
	if err := checkCounts("send", sendCounts, p, send.Count); err != nil {
		return err
	}
	if err := checkCounts("receive", recvCounts, p, recv.Count); err != nil {
		return err
	}
	return c.alltoall(ctx, send, sendCounts, recv, recvCounts)
}

// alltoall runs Alltoall (nil counts: equal blocks) and AlltoallV (counts
// checked).
func (c *Communicator) alltoall(ctx context.Context, send Buffer, sendCounts []int, recv Buffer, recvCounts []int) error {
	p, r := c.Size(), c.Rank()
	if err := checkPair(send, recv); err != nil {
		return err
	}
	if err := checkOverlap(send, recv); err != nil {
		return err
	}
	if sameMemory(send, recv) && send.Count > 0 {
		return fmt.Errorf("collective: alltoall cannot run in place")
	}
	d := opDesc{coll: collAlltoall, dtype: send.DType, bytes: int64(send.Bytes())}
	return c.run(ctx, d, algoPairwise, func(ctx *opContext, o *opRun) error {
		if sendCounts == nil {
			// The communicator's own memory, which only the collective
			// holding opMu uses: no per-call allocation.
			c.counts = evenCountsInto(c.counts, send.Count, p)
			sendCounts, recvCounts = c.counts, c.counts
		}
		esz := send.DType.Size()
		sendPlan, recvPlan := &c.plan, &c.plan2
		sendPlan.set(sendCounts, esz, c.cfg.ChunkBytes)
		recvPlan.set(recvCounts, esz, c.cfg.ChunkBytes)
		src, dst := memOf(send), memOf(recv)
		off, n := sendPlan.segment(r)
		roff, _ := recvPlan.segment(r)
		if err := dst.copyFrom(ctx, roff, src, off, n); err != nil {
			return err
		}
		// Step k pairs every rank with the ranks k ahead and k behind, so each
		// step keeps every link busy in one direction.
		x := &c.steps.alltoall
		defer x.clear()
		x.src, x.dst, x.sendPlan, x.recvPlan = src, dst, sendPlan, recvPlan
		x.sendCounts, x.recvCounts = sendCounts, recvCounts
		for k := 1; k < p; k++ {
			x.to, x.from, x.step = (r+k)%p, (r-k+p)%p, k
			if err := o.exchange(ctx, max(sendPlan.bytes(x.to), recvPlan.bytes(x.from)), x); err != nil {
				return err
			}
		}
		return nil
	})
}

// alltoallRun is one step of an alltoall (stepper): the block for rank to
// out, the one from rank from in.
type alltoallRun struct {
	o                      *opRun
	src, dst               memory
	sendPlan, recvPlan     *segPlan
	sendCounts, recvCounts []int
	to, from, step         int
}

func (x *alltoallRun) clear() { *x = alltoallRun{o: x.o} }

func (x *alltoallRun) sendStep(ctx *opContext, _ int) error {
	return x.o.sendBlock(ctx, x.to, x.step, x.src, x.sendPlan, x.sendCounts[x.to])
}

func (x *alltoallRun) recvStep(ctx *opContext, _ int) error {
	return x.o.recvBlock(ctx, x.from, x.step, x.dst, x.recvPlan, x.recvCounts[x.from])
}

// checkCounts checks per-rank counts against a buffer of total elements.
// (The blocks they lay out travel in chunks of ChunkBytes independently of
// the other blocks.)
func checkCounts(what string, counts []int, p, total int) error {
	sum, err := sumCounts(what, counts, p)
	if err != nil {
		return err
	}
	if sum != total {
		return fmt.Errorf("collective: %s counts add up to %d but the buffer holds %d elements", what, sum, total)
	}
	return nil
}

// blockChunks is how many frames a block of n bytes travels in.
func blockChunks(n, chunkBytes int) int { return max(1, (n+chunkBytes-1)/chunkBytes) }

func (o *opRun) sendBlock(ctx context.Context, to, step int, src memory, plan *segPlan, count int) error {
	off, n := plan.segment(to)
	chunk := o.c.cfg.ChunkBytes
	staging := o.c.stagingFor(src, min(n, chunk))
	for i := range blockChunks(n, chunk) {
		a, b := i*chunk, min(n, (i+1)*chunk)
		buf, err := src.readable(ctx, off+a, b-a, staging)
		if err != nil {
			return err
		}
		if err := o.sendCount(ctx, to, step<<16|i, uint64(count), buf); err != nil {
			return err
		}
	}
	return nil
}

func (o *opRun) recvBlock(ctx context.Context, from, step int, dst memory, plan *segPlan, count int) error {
	off, n := plan.segment(from)
	chunk := o.c.cfg.ChunkBytes
	scratch := o.c.scratchBuf(min(n, chunk))
	for i := range blockChunks(n, chunk) {
		a, b := i*chunk, min(n, (i+1)*chunk)
		buf := dst.writable(off+a, b-a, scratch)
		if err := o.recvCount(ctx, from, step<<16|i, uint64(count), buf); err != nil {
			return err
		}
		if err := dst.commit(ctx, off+a, buf); err != nil {
			return err
		}
	}
	return nil
}
