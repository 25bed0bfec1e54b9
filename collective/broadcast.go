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
	return c.run(ctx, d, algo, func(ctx context.Context, o *opRun) error {
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

func (o *opRun) chainBroadcast(ctx context.Context, m memory, nbytes, root int) error {
	c := o.c
	p, r := c.Size(), c.Rank()
	vr := (r - root + p) % p
	plan := newSegPlan([]int{nbytes}, 1, c.cfg.ChunkBytes)
	nc := plan.nchunks
	nSend, nRecv := nc, nc
	if vr == 0 {
		nRecv = 0
	}
	if vr == p-1 {
		nSend = 0
	}
	next, prev := (r+1)%p, (r-1+p)%p
	scratch := c.scratchBuf(plan.maxChunk)
	staging := c.stagingFor(m, plan.maxChunk)
	send := func(ctx context.Context, k int) error {
		off, n := plan.chunk(0, k)
		b, err := m.readable(ctx, off, n, staging)
		if err != nil {
			return err
		}
		return o.send(ctx, next, k, b)
	}
	recv := func(ctx context.Context, k int) error {
		off, n := plan.chunk(0, k)
		b := m.writable(off, n, scratch)
		if err := o.recv(ctx, prev, k, b); err != nil {
			return err
		}
		return m.commit(ctx, off, b)
	}
	lag := 0 // forward chunk k once it has arrived
	if vr == 0 {
		lag = -1 // the root has it all already
	}
	return o.pipeline(ctx, nSend, nRecv, lag, 0, send, recv)
}
