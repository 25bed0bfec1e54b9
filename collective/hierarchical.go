package collective

import "time"

// The hierarchical algorithms run in phases over the groups of the topology
// (groups): inside each host (local), and between the ranks of one local
// index on every host (cross). Each phase numbers its frames from its own
// base, so a rank that ran a phase the others did not sees a mismatch.
const (
	stepsCross = 1 << 30
	stepsLocal = 2 << 30
)

// hierState is the hierarchical algorithms' per-call layout, kept by the
// communicator so that running them allocates nothing.
type hierState struct {
	local, cross     []int // segment element counts of the local and cross plans
	localAt, crossAt []int // and their element offsets (allgather)
	starts           []int // element offset of every rank's block (allgather)
}

// hierarchicalAllreduce allreduces count elements into dst (src holds this
// rank's contribution; when this host runs one rank, the caller has put it
// in dst and src is dst):
//
//  1. inside the host, a ring reduce-scatter leaves stripe i of the host's
//     sum on local rank i. There are as many stripes as the smallest host
//     has ranks (m): on a host with more, the local ranks from m on own
//     empty segments, so uneven hosts need no special case.
//  2. the ranks of local index i < m on every host allreduce stripe i
//     among themselves (a ring, or recursive doubling when the stripe is at
//     most SmallMessageBytes): each host's link carries each stripe once,
//     the host's data once in all, spread over m pairs of ranks. The ring
//     applies the final scaling as it finishes each segment.
//  3. inside the host, a ring allgather hands every stripe to every rank.
//
// Every rank of a host takes stripe i from the same rank, which received it
// bit-identical from the cross allreduce, so all ranks end bit-identical.
func (o *opRun) hierarchicalAllreduce(ctx *opContext, src, dst memory, count int, factor float64, divisor int) error {
	c := o.c
	g, h := &c.grp, &c.hier
	esz := o.desc.dtype.Size()
	m, li := g.minLocal, g.local.pos
	h.local = resize(h.local, g.local.size())
	for j := range h.local {
		h.local[j] = 0
		if j < m {
			h.local[j] = count / m
			if j < count%m {
				h.local[j]++
			}
		}
	}
	c.plan.set(h.local, esz, c.cfg.ChunkBytes)

	start := o.mark()
	var reduce time.Duration
	if g.local.size() > 1 {
		t, err := o.ringSteps(ctx, &g.local, &c.plan, ringMem{src: src, work: dst, out: dst}, false, 1, 1, 0)
		if err != nil {
			return err
		}
		reduce = t.reduce
	}
	localEnd := o.mark()
	o.phase(PhaseLocalReduceScatter, start, localEnd, reduce)

	if li < m {
		off, n := c.plan.segment(li)
		reduce = 0
		switch cross := &g.cross; {
		case cross.size() == 1:
			if err := dst.scale(ctx, off, n, o.desc.dtype, factor, divisor); err != nil {
				return err
			}
		case n <= c.cfg.SmallMessageBytes || n/esz < cross.size():
			if err := o.recursiveDoubling(ctx, cross, dst, off, n, stepsCross); err != nil {
				return err
			}
			if err := dst.scale(ctx, off, n, o.desc.dtype, factor, divisor); err != nil {
				return err
			}
		default:
			h.cross = evenCountsInto(h.cross, n/esz, cross.size())
			c.plan2.set(h.cross, esz, c.cfg.ChunkBytes)
			t, err := o.ringSteps(ctx, cross, &c.plan2, ringMem{src: dst, work: dst, out: dst, base: off}, true, factor, divisor, stepsCross)
			if err != nil {
				return err
			}
			reduce = t.reduce
		}
	}
	crossEnd := o.mark()
	o.phase(PhaseCrossAllreduce, localEnd, crossEnd, reduce)

	if g.local.size() > 1 {
		if err := o.ringAllgather(ctx, &g.local, &c.plan, dst, stepsLocal); err != nil {
			return err
		}
	}
	o.phase(PhaseLocalAllgather, crossEnd, o.mark(), 0)
	return nil
}

// hierarchicalAllgather gathers every rank's block (counts[r] elements,
// already in dst at its place for this rank) into dst on every rank, for a
// topology whose hosts all run the same number of ranks (L):
//
//  1. the ranks of local index i on every host gather their blocks among
//     themselves (a ring), so each host's link carries each of the host's
//     blocks once, over L pairs of ranks at a time;
//  2. inside the host, one ring allgather per host hands every rank the
//     blocks of that host's ranks, each of which one local rank now holds.
func (o *opRun) hierarchicalAllgather(ctx *opContext, counts []int, dst memory) error {
	c := o.c
	g, h := &c.grp, &c.hier
	esz := o.desc.dtype.Size()
	h.starts = resize(h.starts, len(counts))
	at := 0
	for r, n := range counts {
		h.starts[r] = at
		at += n
	}

	start := o.mark()
	cross := &g.cross
	h.cross, h.crossAt = resize(h.cross, cross.size()), resize(h.crossAt, cross.size())
	for i, r := range cross.ranks {
		h.cross[i], h.crossAt[i] = counts[r], h.starts[r]
	}
	c.plan2.setAt(h.cross, h.crossAt, esz, c.cfg.ChunkBytes)
	if err := o.ringAllgather(ctx, cross, &c.plan2, dst, stepsCross); err != nil {
		return err
	}
	crossEnd := o.mark()
	o.phase(PhaseCrossAllgather, start, crossEnd, 0)

	local := &g.local
	if local.size() > 1 {
		base := stepsLocal
		for _, rs := range c.topo.HostRanks {
			h.local, h.localAt = resize(h.local, len(rs)), resize(h.localAt, len(rs))
			for j, r := range rs {
				h.local[j], h.localAt[j] = counts[r], h.starts[r]
			}
			c.plan.setAt(h.local, h.localAt, esz, c.cfg.ChunkBytes)
			if err := o.ringAllgather(ctx, local, &c.plan, dst, base); err != nil {
				return err
			}
			base += (local.size() - 1) * c.plan.nchunks
		}
	}
	o.phase(PhaseLocalAllgather, crossEnd, o.mark(), 0)
	return nil
}
