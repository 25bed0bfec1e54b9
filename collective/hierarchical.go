package collective

import (
	"sync/atomic"
	"time"
)

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
//
// A buffer of host memory of at least two Config.HierarchicalPieceBytes runs
// as pieces (hierarchicalPipelined), whose phases overlap. Every rank decides
// alike from the size alone (a host of one rank too, whose local phases are
// empty), so the ranks of every cross group cut their stripes alike.
func (o *opRun) hierarchicalAllreduce(ctx *opContext, src, dst memory, count int, factor float64, divisor int) error {
	c := o.c
	g, h := &c.grp, &c.hier
	esz := o.desc.dtype.Size()
	if pieces := hierPieces(count, esz, c.cfg.HierarchicalPieceBytes); pieces > 1 && src.dev == nil && dst.dev == nil {
		return o.hierarchicalPipelined(ctx, src, dst, count, pieces, factor, divisor)
	}
	m, li := g.minLocal, g.local.pos
	h.local = resize(h.local, g.local.size())
	stripes(h.local, nil, count, m, 0)
	c.plan.set(h.local, esz, c.cfg.ChunkBytes)

	start := o.mark()
	var reduce time.Duration
	if g.local.size() > 1 {
		t, err := o.ringSteps(ctx, &c.lane, &g.local, &c.plan, ringMem{src: src, work: dst, out: dst}, false, 1, 1, 0)
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
			t, err := o.ringSteps(ctx, &c.lane, cross, &c.plan2, ringMem{src: dst, work: dst, out: dst, base: off}, true, factor, divisor, stepsCross)
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

// maxHierPieces bounds the pieces of a pipelined hierarchical allreduce: a
// larger buffer gets larger pieces.
const maxHierPieces = 64

// hierPieces is how many pieces a hierarchical allreduce of count elements
// of esz bytes runs as: one (no pipelining) below two pieces of pieceBytes,
// or with pieceBytes negative.
func hierPieces(count, esz, pieceBytes int) int {
	if pieceBytes <= 0 {
		return 1
	}
	return min(maxHierPieces, count*esz/pieceBytes)
}

// hierarchicalPipelined is the hierarchical allreduce of count elements cut
// into pieces (consecutive, as even as count allows), each allreduced by the
// three phases of hierarchicalAllreduce, so that the phases of different
// pieces overlap: while the ranks of one local index allreduce piece k's
// stripes across hosts (on the communicator's cross lane, run by its driver
// goroutine), the host's ranks reduce-scatter piece k+1 and allgather piece
// k-1 over their own links (on this goroutine). The link between hosts is
// what bounds a large allreduce; this keeps it busy while the host works.
//
// Each goroutine runs its pieces in the same order on every rank (inside
// the host: reduce-scatter 0, then reduce-scatter k+1 and allgather k for
// k = 0, 1, …), so the frames of each group stay in step; piece k's
// allgather waits for its cross allreduce, and the cross allreduce for its
// reduce-scatter. Every piece's phase numbers its frames on from the
// previous piece's (stepsCross, stepsLocal bases as for one piece). Each
// piece ends bit-identical on every rank for the reason one buffer does.
//
// A failure on either goroutine cancels the other (they share ctx), and the
// error returned is the one that stopped the collective. The tracer sees
// each phase once, from its first piece's start to its last piece's end.
func (o *opRun) hierarchicalPipelined(ctx *opContext, src, dst memory, count, pieces int, factor float64, divisor int) error {
	c := o.c
	g := &c.grp
	// The frames carry the number of pieces (as a layout), so that ranks
	// that cut the buffer differently see a mismatch, not each other's
	// pieces.
	o.infoMu.Lock()
	o.desc.aux = uint32(pieces)
	o.infoMu.Unlock()
	hp := c.hierPipe
	hp.o, hp.ctx, hp.src, hp.dst = o, ctx, src, dst
	hp.count, hp.pieces, hp.factor, hp.divisor = count, pieces, factor, divisor
	hp.esz = o.desc.dtype.Size()
	hp.rsDone.Store(0)
	hp.crossDone.Store(0)
	hp.crossTimes = phaseTimes{}
	defer hp.clear()

	crossRuns := g.local.pos < g.minLocal
	if crossRuns {
		if err := c.startJob(c.driver, hp); err != nil {
			return err
		}
	} else {
		hp.crossDone.Store(int64(pieces)) // no stripe: nothing to wait for
	}
	rs, ag, waiting, err := hp.localHalf()
	var crossErr error
	if crossRuns {
		if err != nil {
			ctx.cancel(err)
		}
		crossErr = <-hp.result
	}
	if err != nil {
		if waiting && crossErr != nil {
			// This goroutine only waited for the cross half when the
			// context ended (a deadline, say): the cross half's error
			// names the peer it waited for.
			return crossErr
		}
		return firstCause(ctx, err, crossErr)
	}
	if crossErr != nil {
		return crossErr
	}
	o.phase(PhaseLocalReduceScatter, rs.start, rs.end, rs.reduce)
	cr := hp.crossTimes
	if !crossRuns {
		cr = phaseTimes{start: rs.end, end: rs.end}
	}
	o.phase(PhaseCrossAllreduce, cr.start, cr.end, cr.reduce)
	o.phase(PhaseLocalAllgather, ag.start, ag.end, 0)
	return nil
}

// phaseTimes is when a phase of a pipelined collective ran (its first
// piece's start, its last piece's end, from the collective's start) and its
// time in reduce kernels; zero when untraced.
type phaseTimes struct{ start, end, reduce time.Duration }

// hierPipe is the state of one pipelined hierarchical allreduce, shared by
// its two goroutines and kept by the communicator.
type hierPipe struct {
	o        *opRun
	ctx      *opContext
	src, dst memory
	count    int
	pieces   int
	esz      int
	factor   float64
	divisor  int
	// rsDone and crossDone count the pieces whose local reduce-scatter and
	// cross allreduce have finished; rsReady and crossReady (one slot each)
	// wake the other goroutine after a count went up.
	rsDone, crossDone   atomic.Int64
	rsReady, crossReady chan struct{}
	result              chan error // the cross half's outcome
	// crossTimes is the cross half's, read after result.
	crossTimes phaseTimes
}

func newHierPipe() *hierPipe {
	return &hierPipe{rsReady: make(chan struct{}, 1), crossReady: make(chan struct{}, 1), result: make(chan error, 1)}
}

// clear drops the references to the collective's memory.
func (hp *hierPipe) clear() {
	hp.o, hp.ctx, hp.src, hp.dst = nil, nil, memory{}, memory{}
}

// piece is piece k's first element and element count.
func (hp *hierPipe) piece(k int) (at, n int) {
	a := int(int64(k) * int64(hp.count) / int64(hp.pieces))
	b := int(int64(k+1) * int64(hp.count) / int64(hp.pieces))
	return a, b - a
}

// stripes lays out n elements as the host's stripes into counts (one per
// local rank: the first m share them, the others get none) and, when at is
// not nil, their element offsets from base into at.
func stripes(counts, at []int, n, m, base int) {
	off := base
	for j := range counts {
		counts[j] = 0
		if j < m {
			counts[j] = n / m
			if j < n%m {
				counts[j]++
			}
		}
		if at != nil {
			at[j] = off
		}
		off += counts[j]
	}
}

// waitCount waits until *done exceeds k, woken by ready, or ctx ends.
func waitCount(ctx *opContext, done *atomic.Int64, ready chan struct{}, k int) error {
	for done.Load() <= int64(k) {
		select {
		case <-ready:
		case <-ctx.Done():
			return ctx.Cause()
		}
	}
	return nil
}

// localHalf runs the phases inside the host, piece by piece, on the
// collective's goroutine and the communicator's lane: reduce-scatter of
// piece 0, then for each k the reduce-scatter of piece k+1 and the
// allgather of piece k (once its cross allreduce is done). waiting says
// that it failed while waiting for the cross half, not in a step.
func (hp *hierPipe) localHalf() (rs, ag phaseTimes, waiting bool, err error) {
	o, ctx := hp.o, hp.ctx
	c := o.c
	g, h := &c.grp, &c.hier
	local := &g.local
	L := local.size()
	h.local, h.localAt = resize(h.local, L), resize(h.localAt, L)
	rsBase, agBase := 0, stepsLocal
	rs.start = o.mark()
	for k := 0; k <= hp.pieces; k++ {
		if k < hp.pieces {
			at, n := hp.piece(k)
			if L > 1 {
				stripes(h.local, nil, n, g.minLocal, 0)
				c.plan.set(h.local, hp.esz, c.cfg.ChunkBytes)
				t, err := o.ringSteps(ctx, &c.lane, local, &c.plan, ringMem{src: hp.src, work: hp.dst, out: hp.dst, base: at * hp.esz}, false, 1, 1, rsBase)
				if err != nil {
					return rs, ag, false, err
				}
				rsBase += (L - 1) * c.plan.nchunks
				rs.reduce += t.reduce
			}
			rs.end = o.mark()
			hp.rsDone.Add(1)
			wake(hp.rsReady)
		}
		if k == 0 {
			continue
		}
		// The allgather of piece k-1, once its stripes crossed.
		if err := waitCount(ctx, &hp.crossDone, hp.crossReady, k-1); err != nil {
			return rs, ag, true, err
		}
		t := o.mark()
		if k == 1 {
			ag.start = t
		}
		if L > 1 {
			at, n := hp.piece(k - 1)
			stripes(h.local, h.localAt, n, g.minLocal, at)
			c.plan.setAt(h.local, h.localAt, hp.esz, c.cfg.ChunkBytes)
			if err := o.ringAllgatherOn(ctx, &c.lane, local, &c.plan, hp.dst, agBase); err != nil {
				return rs, ag, false, err
			}
			agBase += (L - 1) * c.plan.nchunks
		}
		ag.end = o.mark()
	}
	return rs, ag, false, nil
}

// runJob runs the cross half on the communicator's driver goroutine.
func (hp *hierPipe) runJob() {
	err := hp.crossHalf()
	if err != nil {
		hp.ctx.cancel(err)
	}
	hp.result <- err
}

// crossHalf allreduces this rank's stripe of every piece among the ranks of
// its local index on every host, piece by piece as their reduce-scatters
// finish, on the communicator's cross lane.
func (hp *hierPipe) crossHalf() error {
	o, ctx := hp.o, hp.ctx
	c := o.c
	g, h := &c.grp, &c.hier
	cross := &g.cross
	m, li := g.minLocal, g.local.pos
	base := stepsCross
	for k := 0; k < hp.pieces; k++ {
		if err := waitCount(ctx, &hp.rsDone, hp.rsReady, k); err != nil {
			return err
		}
		t0 := o.mark()
		if k == 0 {
			hp.crossTimes.start = t0
		}
		at, n := hp.piece(k)
		// This rank's stripe of the piece (as stripes lays them out).
		sOff := at + li*(n/m) + min(li, n%m)
		sLen := n / m
		if li < n%m {
			sLen++
		}
		off, nb := sOff*hp.esz, sLen*hp.esz
		switch {
		case cross.size() == 1:
			if err := hp.dst.scale(ctx, off, nb, o.desc.dtype, hp.factor, hp.divisor); err != nil {
				return err
			}
		case nb <= c.cfg.SmallMessageBytes || sLen < cross.size():
			if err := o.recursiveDoublingOn(ctx, &c.crossLane, cross, hp.dst, off, nb, base); err != nil {
				return err
			}
			base += doublingSteps(cross.size())
			if err := hp.dst.scale(ctx, off, nb, o.desc.dtype, hp.factor, hp.divisor); err != nil {
				return err
			}
		default:
			h.cross = evenCountsInto(h.cross, sLen, cross.size())
			c.plan2.set(h.cross, hp.esz, c.cfg.ChunkBytes)
			t, err := o.ringSteps(ctx, &c.crossLane, cross, &c.plan2, ringMem{src: hp.dst, work: hp.dst, out: hp.dst, base: off}, true, hp.factor, hp.divisor, base)
			if err != nil {
				return err
			}
			base += 2 * (cross.size() - 1) * c.plan2.nchunks
			hp.crossTimes.reduce += t.reduce
		}
		hp.crossTimes.end = o.mark()
		hp.crossDone.Add(1)
		wake(hp.crossReady)
	}
	return nil
}
