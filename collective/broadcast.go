package collective

import (
	"context"
	"fmt"
)

// Broadcast copies root's buf into buf on every other rank. Small buffers travel
// down a binomial tree (log2 p hops); large ones down a pipelined chain, so every
// link carries the data once and all links are busy at the same time. Both run
// over the ranks host by host, as the rings do (see broadcastOrder): the chain
// enters every host but the root's once, and each subtree of the tree is a run
// of adjacent ranks.
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

// broadcastOrder is the order a broadcast from one root runs over: the
// root, the other ranks of its host (in the flat ring's order, from the
// root's on, wrapping), then the other hosts' ranks in the flat ring's order
// from the host after the root's, wrapping. Each host's ranks are adjacent in
// it, as in the rings, and the root's host comes first even when the root is
// not its host's first rank: a chain over it enters every other host once.
type broadcastOrder struct {
	flat       []int
	flatPos    []int
	start, n   int // the root's host: the flat position of its first rank, its number of ranks
	rootOffset int // the root's place among its host's ranks
}

func (g *groups) broadcastOrder(root int) broadcastOrder {
	h := g.host[root]
	start := g.hostStart[h]
	return broadcastOrder{flat: g.flat.ranks, flatPos: g.flatPos, start: start, n: g.hostSize[h],
		rootOffset: g.flatPos[root] - start}
}

// rank is the rank at position v (0: the root).
func (b broadcastOrder) rank(v int) int {
	if v < b.n {
		return b.flat[b.start+(b.rootOffset+v)%b.n]
	}
	return b.flat[(b.start+v)%len(b.flat)]
}

// pos is rank r's position.
func (b broadcastOrder) pos(r int) int {
	q, p := b.flatPos[r], len(b.flat)
	if q >= b.start && q < b.start+b.n {
		return (q - b.start - b.rootOffset + b.n) % b.n
	}
	return (q - b.start + p) % p
}

func (o *opRun) binomialBroadcast(ctx context.Context, m memory, nbytes, root int) error {
	c := o.c
	p := c.Size()
	order := c.grp.broadcastOrder(root)
	vr, real := order.pos(c.Rank()), order.rank
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
	p := c.Size()
	order := c.grp.broadcastOrder(root)
	vr := order.pos(c.Rank())
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
	x.next, x.prev = order.rank((vr+1)%p), order.rank((vr-1+p)%p)
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
