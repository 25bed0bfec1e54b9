package collective

import (
	"context"
	"fmt"
)

// Broadcast copies root's buf into buf on every other rank. Small buffers travel
// down a binomial tree (log2 p hops); large ones down a pipelined chain, so every
// link carries the data once and all links are busy at the same time.
func (c *Communicator) Broadcast(ctx context.Context, buf Buffer, root int) error {
	if err := buf.validate("broadcast"); err != nil {
		return err
	}
	p := c.Size()
	if root < 0 || root >= p {
		return fmt.Errorf("collective: broadcast root %d outside world of size %d", root, p)
	}
	nbytes := buf.Bytes()
	algo := algoChain
	if nbytes <= c.cfg.SmallMessageBytes {
		algo = algoTree
	}
	d := opDesc{coll: collBroadcast, dtype: buf.DType, count: uint64(buf.Count), aux: uint32(root)}
	return c.run(ctx, d, algo, func(ctx *opContext, o *opRun) error {
		if p == 1 {
			return nil
		}
		m := memOf(buf)
		if algo == algoTree {
			return o.binomialBroadcast(ctx, m, nbytes, root)
		}
		return o.chainBroadcast(ctx, m, nbytes, root)
	})
}

func (o *opRun) binomialBroadcast(ctx context.Context, m memory, nbytes, root int) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	vr := (r - root + p) % p
	real := func(v int) int { return (v + root) % p }
	mask, level := 1, 0
	for mask < p {
		if vr&mask != 0 {
			b := m.writable(0, nbytes, c.scratchBuf(nbytes))
			if err := o.recv(ctx, real(vr-mask), level, b); err != nil {
				return err
			}
			if err := m.commit(ctx, 0, b); err != nil {
				return err
			}
			break
		}
		mask <<= 1
		level++
	}
	b, err := m.readable(ctx, 0, nbytes, c.stagingFor(m, nbytes))
	if err != nil {
		return err
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		level--
		if vr+mask < p {
			if err := o.send(ctx, real(vr+mask), level, b); err != nil {
				return err
			}
		}
	}
	return nil
}

func (o *opRun) chainBroadcast(ctx *opContext, m memory, nbytes, root int) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	vr := (r - root + p) % p
	c.counts = resize(c.counts, 1)
	c.counts[0] = nbytes
	c.plan.set(c.counts, 1, c.cfg.ChunkBytes)
	nc := c.plan.nchunks
	nSend, nRecv := nc, nc
	if vr == 0 {
		nRecv = 0
	}
	if vr == p-1 {
		nSend = 0
	}
	x := &c.steps.chain
	defer x.clear()
	x.m, x.plan = m, &c.plan
	x.next, x.prev = (r+1)%p, (r-1+p)%p
	x.scratch = c.scratchBuf(c.plan.maxChunk)
	x.staging = c.stagingFor(m, c.plan.maxChunk)
	lag := 0 // forward chunk k once it has arrived
	if vr == 0 {
		lag = -1 // the root has it all already
	}
	return o.pipeline(ctx, nSend, nRecv, lag, 0, x)
}

// chainRun is the state of one chain broadcast, kept by the communicator:
// item k is chunk k of m, received from prev and forwarded to next.
type chainRun struct {
	o                *opRun
	m                memory
	plan             *segPlan
	next, prev       int
	scratch, staging []byte
}

func (x *chainRun) clear() { *x = chainRun{o: x.o} }

func (x *chainRun) sendStep(ctx *opContext, k int) error {
	off, n := x.plan.chunk(0, k)
	b, err := x.m.readable(ctx, off, n, x.staging)
	if err != nil {
		return err
	}
	return x.o.send(ctx, x.next, k, b)
}

func (x *chainRun) recvStep(ctx *opContext, k int) error {
	off, n := x.plan.chunk(0, k)
	b := x.m.writable(off, n, x.scratch)
	if err := x.o.recv(ctx, x.prev, k, b); err != nil {
		return err
	}
	return x.m.commit(ctx, off, b)
}
