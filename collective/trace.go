package collective

import (
	"time"
)

// Tracer observes a communicator's collectives, for a timeline
// (package timeline) or metrics. Config.Tracer sets it; nil costs one
// pointer check per collective and per phase.
//
// Calls come from the goroutine running the collective, in order: Start,
// then zero or more Phase, then End. A tracer must return quickly and must
// not block or call back into the communicator: record and return.
type Tracer interface {
	// CollectiveStart: op is numbered and about to move data.
	CollectiveStart(op OpInfo, at time.Time)
	// CollectivePhase: one phase of op ran (see Phase).
	CollectivePhase(op OpInfo, ph PhaseInfo)
	// CollectiveEnd: op ended at end, having started at start; err is its
	// failure (nil on success).
	CollectiveEnd(op OpInfo, start, end time.Time, err error)
}

// OpInfo describes one collective call of a communicator.
type OpInfo struct {
	Epoch      uint64 // the membership epoch of the world
	Rank, Size int
	Seq        uint64 // the communicator's collective number, 1 for the first
	// Collective names it: allreduce, broadcast, allgather, reducescatter,
	// alltoall or barrier.
	Collective string
	// Algorithm is what runs it: ring, hierarchical, recursive-doubling,
	// tree, chain, pairwise or dissemination.
	Algorithm string
	DType     DType
	Op        ReduceOp // for allreduce and reducescatter; 0 otherwise
	Count     uint64   // elements (all ranks' together for allgather)
	Bytes     int64    // the buffer's size in bytes (this rank's send buffer for alltoall)
	Root      int      // broadcast's root; 0 otherwise
}

// Phase names a part of a collective's algorithm. Collectives whose
// algorithm is one piece (recursive doubling, the broadcast tree and chain,
// pairwise alltoall, the dissemination barrier) report no phases: their
// collective event, which names the algorithm, is the phase.
type Phase uint8

// The phases the algorithms report.
const (
	// PhaseReduceScatter is the ring's first half: p-1 steps that leave each
	// rank with one fully reduced segment (allreduce, reducescatter).
	PhaseReduceScatter Phase = iota + 1
	// PhaseAllgather is the ring's second half: p-1 steps that circulate
	// the reduced segments (allreduce).
	PhaseAllgather
	// PhaseLocalReduceScatter, PhaseCrossAllreduce and PhaseLocalAllgather
	// are the hierarchical allreduce's: a reduce-scatter inside the host,
	// an allreduce of this rank's stripe between hosts (none on ranks that
	// carry no stripe), an allgather inside the host.
	PhaseLocalReduceScatter
	PhaseCrossAllreduce
	PhaseLocalAllgather
	// PhaseCrossAllgather is the hierarchical allgather's gather between
	// hosts (PhaseLocalAllgather follows it).
	PhaseCrossAllgather
)

func (p Phase) String() string {
	switch p {
	case PhaseReduceScatter:
		return "reduce-scatter"
	case PhaseAllgather:
		return "allgather"
	case PhaseLocalReduceScatter:
		return "local-reduce-scatter"
	case PhaseCrossAllreduce:
		return "cross-allreduce"
	case PhaseLocalAllgather:
		return "local-allgather"
	case PhaseCrossAllgather:
		return "cross-allgather"
	}
	return "phase"
}

// PhaseInfo is one phase of a collective as it ran on this rank.
type PhaseInfo struct {
	Phase      Phase
	Start, End time.Time
	// Reduce is the time spent in reduce kernels within the phase (the rest
	// is waiting for and moving data).
	Reduce time.Duration
}

// algoName names an algorithm constant.
func algoName(a uint8) string {
	switch a {
	case algoRing:
		return "ring"
	case algoRecursiveDoubling:
		return "recursive-doubling"
	case algoTree:
		return "tree"
	case algoChain:
		return "chain"
	case algoPairwise:
		return "pairwise"
	case algoDissemination:
		return "dissemination"
	case algoHierarchical:
		return "hierarchical"
	case algoAdasum:
		return "adasum"
	}
	return "algorithm"
}

// info describes the collective for a tracer or Progress.
func (o *opRun) info() OpInfo {
	o.infoMu.Lock()
	d, algo := o.desc, o.algo
	o.infoMu.Unlock()
	c := o.c
	bytes := d.bytes
	if bytes == 0 {
		bytes = int64(d.count) * int64(d.dtype.Size())
	}
	inf := OpInfo{Epoch: c.world.Epoch, Rank: c.world.Rank, Size: c.world.Size(), Seq: d.seq,
		Collective: d.coll.String(), Algorithm: algoName(algo), DType: d.dtype, Count: d.count, Bytes: bytes}
	if d.coll.reduces() {
		inf.Op = d.op
	}
	if d.coll.rooted() {
		inf.Root = int(d.aux)
	}
	return inf
}

// phase reports one phase to the tracer: it ran from start to end, offsets
// from the collective's start (mark).
func (o *opRun) phase(p Phase, start, end, reduce time.Duration) {
	if t := o.c.tracer; t != nil {
		t.CollectivePhase(o.info(), PhaseInfo{Phase: p, Start: o.t0.Add(start), End: o.t0.Add(end), Reduce: reduce})
	}
}

// Progress is what a communicator is doing, for a stall inspector: the
// collective in flight, if any, and the peer it is waiting for.
type Progress struct {
	Epoch      uint64
	Rank, Size int
	// Started is how many collectives this communicator has begun; with
	// InFlight, the last of them is running (Op.Seq == Started).
	Started  uint64
	InFlight bool
	Op       OpInfo
	// WaitingOn is the rank whose frame the collective's receiving side is
	// waiting for; -1 when it is not waiting to receive (sending, reducing,
	// or no collective in flight).
	WaitingOn int
	// Failed is the communicator's failure, nil while it works.
	Failed error
}

// Progress returns what the communicator is doing now; safe to call from any
// goroutine, and cheap enough to poll. A stall inspector polls every
// communicator of a process and reports collectives that stay in flight, and
// the peers they wait for, past its threshold.
func (c *Communicator) Progress() Progress {
	p := Progress{Epoch: c.world.Epoch, Rank: c.world.Rank, Size: c.world.Size(), Started: c.started.Load(), WaitingOn: -1, Failed: c.Err()}
	if o := c.inflight.Load(); o != nil {
		p.InFlight, p.Op = true, o.info()
		p.WaitingOn = int(o.waitingOn.Load())
	}
	return p
}

// waitFor notes that the receiving side waits for peer (-1: no longer).
func (o *opRun) waitFor(peer int) { o.waitingOn.Store(int32(peer)) }

// traced says whether a tracer is watching (and times are worth taking).
func (o *opRun) traced() bool { return o.c.tracer != nil }

// mark is the time since the collective started when tracing, 0 otherwise.
// It reads only the monotonic clock, about a third of time.Now's cost, so
// timing phases and reductions stays cheap.
func (o *opRun) mark() time.Duration {
	if o.c.tracer == nil {
		return 0
	}
	return time.Since(o.t0)
}

// Tracers combines tracers into one that calls each in turn (a timeline's
// and a metrics counter, say). Nil tracers are left out; with none left it
// returns nil, which costs nothing.
func Tracers(ts ...Tracer) Tracer {
	var keep multiTracer
	for _, t := range ts {
		if t != nil {
			keep = append(keep, t)
		}
	}
	switch len(keep) {
	case 0:
		return nil
	case 1:
		return keep[0]
	}
	return keep
}

type multiTracer []Tracer

func (m multiTracer) CollectiveStart(op OpInfo, at time.Time) {
	for _, t := range m {
		t.CollectiveStart(op, at)
	}
}

func (m multiTracer) CollectivePhase(op OpInfo, ph PhaseInfo) {
	for _, t := range m {
		t.CollectivePhase(op, ph)
	}
}

func (m multiTracer) CollectiveEnd(op OpInfo, start, end time.Time, err error) {
	for _, t := range m {
		t.CollectiveEnd(op, start, end, err)
	}
}
