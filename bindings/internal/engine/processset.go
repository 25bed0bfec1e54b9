package engine

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// Process sets, as Horovod's: collectives among some of the world's ranks.
//
// A process set is a list of the current world's ranks, registered on
// every rank of the world by AddProcessSet (a call of its own in the
// submission order, which every rank makes alike, checked as collectives
// are) under an id that is the same everywhere; id 0 is the whole world.
// Its members run collectives on it (the ...On forms) while the others run
// other calls, on other sets or none: on each member the set's collective
// runs on a subset communicator over the world's links
// (collective.Communicator.Subset), built at its first use, with sequence
// numbers of its own, so a call on one set never pairs with another set's.
// Roots are world ranks (as in Horovod); per-rank counts have one entry per
// member, in rank order.
//
// A process's calls still run one at a time in the order it submitted them.
// Members of a set must submit its calls in the same order, and ranks must
// not wait on each other in a cycle: a rank inside a call on set A waits for
// A's other members to reach it, so when another member of A runs a call on
// set B first, B's members must be able to finish it without this rank.
// (Horovod negotiates every set's calls in its background loop and would run
// B first; gorovod runs in submission order.) A cycle breaks the world:
// at once where two of its sets share a pair of ranks (a rank receives the
// other set's frames, whose sequence numbers differ: a MismatchError), else
// when the I/O timeout passes.
//
// A world change removes every process set but the world's: its ranks were
// the old world's. Calls on a removed set are refused (ErrUnknownSet); the
// trainer adds the sets it needs again after Reset, as a Horovod script does
// after its elastic reset (hvd.init() again, which registers no sets). Ids are
// never reused, so a stale id cannot name a newer set.

// ErrUnknownSet is wrapped by the error of a call on a process set that was
// never added, was removed, or did not survive a world change. It wraps
// ErrInvalid: the world is untouched.
var ErrUnknownSet = fmt.Errorf("%w: unknown process set", ErrInvalid)

// ErrNotMember is wrapped by the error of a call on a process set this
// process is not a member of. It wraps ErrInvalid.
var ErrNotMember = fmt.Errorf("%w: this process is not a member of the process set", ErrInvalid)

// ErrDuplicateSet is wrapped by AddProcessSet's error when a set of the same
// ranks exists already (the world's own included). It wraps ErrInvalid.
var ErrDuplicateSet = fmt.Errorf("%w: a process set of these ranks exists already", ErrInvalid)

// processSet is a registered process set.
type processSet struct {
	id    int32
	ranks []int // world ranks, increasing
	me    int   // this process's index in ranks, -1 when not a member
	// comm is the subset communicator for the members, built from parent
	// (the world's communicator) at the set's first collective after it
	// was made; nil until then and on non-members.
	comm, parent *collective.Communicator
}

// ProcessSetInfo describes a registered process set.
type ProcessSetInfo struct {
	ID    int32
	Ranks []int // world ranks, increasing
	// Rank is this process's rank in the set (its index in Ranks), -1 when
	// it is not a member.
	Rank int
}

// ProcessSet returns what set id (0: the world) is, or an error wrapping
// ErrUnknownSet.
func (e *Engine) ProcessSet(id int32) (ProcessSetInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.processSet(id)
}

// processSet is ProcessSet under mu.
func (e *Engine) processSet(id int32) (ProcessSetInfo, error) {
	if id == 0 {
		ranks := make([]int, e.topo.Size)
		for r := range ranks {
			ranks[r] = r
		}
		return ProcessSetInfo{ID: 0, Ranks: ranks, Rank: e.topo.Rank}, nil
	}
	ps, ok := e.sets[id]
	if !ok {
		return ProcessSetInfo{}, fmt.Errorf("%w %d (never added, removed, or removed by a world change)", ErrUnknownSet, id)
	}
	return ProcessSetInfo{ID: id, Ranks: slices.Clone(ps.ranks), Rank: ps.me}, nil
}

// ProcessSets returns the ids of the registered process sets, 0 (the
// world) first, then in the order they were added.
func (e *Engine) ProcessSets() []int32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := []int32{0}
	for id := range e.sets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// AddProcessSet registers the process set of the world's ranks (any order,
// no repeats) on every rank and writes its id into *id once the call
// completes. Every rank of the world must make the call, in the same place
// of its sequence and with the same ranks (a difference is a
// *collective.MismatchError on every rank); a set of the same ranks as an
// existing one (or the whole world) fails with ErrDuplicateSet.
func (e *Engine) AddProcessSet(ranks []int, id *int32) (Handle, error) {
	if id == nil {
		return 0, fmt.Errorf("%w: add process set needs somewhere to write the id", ErrInvalid)
	}
	ranks = slices.Clone(ranks)
	slices.Sort(ranks)
	size := e.Topology().Size
	for i, r := range ranks {
		switch {
		case r < 0 || r >= size:
			return 0, fmt.Errorf("%w: process set rank %d outside the world of %d", ErrInvalid, r, size)
		case i > 0 && r == ranks[i-1]:
			return 0, fmt.Errorf("%w: process set rank %d given twice", ErrInvalid, r)
		}
	}
	if len(ranks) == 0 {
		return 0, fmt.Errorf("%w: a process set of no ranks", ErrInvalid)
	}
	d := describe(kindAddSet, nil, nil, nil, 0)
	d[fieldTensors] = int64(len(ranks))
	d[fieldLayout] = ranksDigest(ranks)
	return e.submit(&call{what: "add process set", desc: d, run: func(ctx context.Context, s *gsync.Session) error {
		// The id: one above the highest any rank has given (a worker that
		// joined later has given fewer), so that it is the same everywhere.
		e.mu.Lock()
		next := []int64{int64(e.nextSet) + 1}
		e.mu.Unlock()
		if err := s.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
			return collective.Allreduce(ctx, c, next, next, collective.Max)
		}); err != nil {
			return err
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		e.nextSet = max(e.nextSet, int32(next[0]))
		if len(ranks) == e.topo.Size {
			return fmt.Errorf("%w: %v is the whole world, process set 0", ErrDuplicateSet, ranks)
		}
		for _, ps := range e.sets {
			if slices.Equal(ps.ranks, ranks) {
				return fmt.Errorf("%w: %v is process set %d", ErrDuplicateSet, ranks, ps.id)
			}
		}
		ps := &processSet{id: int32(next[0]), ranks: ranks, me: slices.Index(ranks, e.topo.Rank)}
		e.sets[ps.id] = ps
		*id = ps.id
		return nil
	}})
}

// RemoveProcessSet unregisters process set id on every rank (which must all
// make the call, as for AddProcessSet) once the calls submitted before it
// have run; calls on it submitted later are refused. Removing set 0, or one
// that is not registered, fails with ErrUnknownSet.
func (e *Engine) RemoveProcessSet(id int32) (Handle, error) {
	if id == 0 {
		return 0, fmt.Errorf("%w: process set 0 (the world) cannot be removed", ErrUnknownSet)
	}
	if _, err := e.ProcessSet(id); err != nil {
		return 0, err
	}
	d := describe(kindRemoveSet, nil, nil, nil, int(id))
	return e.submit(&call{what: "remove process set", desc: d, run: func(ctx context.Context, s *gsync.Session) error {
		e.mu.Lock()
		ps, ok := e.sets[id]
		delete(e.sets, id)
		e.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w %d", ErrUnknownSet, id)
		}
		if ps.comm != nil {
			ps.comm.Close()
		}
		return nil
	}})
}

// ranksDigest is a description field that differs between rank lists.
func ranksDigest(ranks []int) int64 {
	h := fnv.New64a()
	for _, r := range ranks {
		fmt.Fprintf(h, "%d,", r)
	}
	return int64(h.Sum64() >> 1)
}

// member returns set id's members and this process's rank among them, for a
// call being submitted; an error when the set is unknown or this process
// is not a member. Set 0 is the world.
func (e *Engine) member(what string, id int32) (ranks []int, me int, err error) {
	info, err := e.ProcessSet(id)
	if err != nil {
		return nil, -1, fmt.Errorf("%s: %w", what, err)
	}
	if info.Rank < 0 {
		return nil, -1, fmt.Errorf("%s: rank %d: %w %d (ranks %v)", what, e.Topology().Rank, ErrNotMember, id, info.Ranks)
	}
	return info.Ranks, info.Rank, nil
}

// collectiveOn runs fn on process set id's communicator (0: the world's)
// through the session's failure handling (gsync.Session.Collective): a
// failure on the set breaks the world, whose links it shares, and is
// recovered from as any other.
func (e *Engine) collectiveOn(ctx context.Context, s *gsync.Session, id int32, fn func(ctx context.Context, c *collective.Communicator) error) error {
	if id == 0 {
		return s.Collective(ctx, fn)
	}
	return s.Collective(ctx, func(ctx context.Context, world *collective.Communicator) error {
		sub, err := e.subset(world, id)
		if err != nil {
			return err
		}
		return fn(ctx, sub)
	})
}

// subset returns set id's communicator over world, building it at its first
// use (on the executing goroutine, between two calls).
func (e *Engine) subset(world *collective.Communicator, id int32) (*collective.Communicator, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ps, ok := e.sets[id]
	if !ok {
		// Removed by a world change between the call's submission and its
		// run (such calls normally fail first as the old world's).
		return nil, fmt.Errorf("%w %d (removed before the call ran)", ErrUnknownSet, id)
	}
	if ps.me < 0 {
		return nil, fmt.Errorf("%w %d", ErrNotMember, id)
	}
	if ps.comm != nil && ps.parent == world {
		return ps.comm, nil
	}
	if ps.comm != nil {
		ps.comm.Close()
	}
	// Frames carry a 16-bit subset id; ids are never reused, so they wrap
	// only after MaxSubsetID sets, long gone by then.
	sub, err := world.Subset(int((ps.id-1)%collective.MaxSubsetID)+1, ps.ranks)
	if err != nil {
		return nil, fmt.Errorf("%w: process set %d: %v", ErrInternal, id, err)
	}
	ps.comm, ps.parent = sub, world
	return sub, nil
}

// dropSets removes every process set but the world's (under mu), after a
// world change or at Close.
func (e *Engine) dropSets() {
	for id, ps := range e.sets {
		if ps.comm != nil {
			ps.comm.Close()
		}
		delete(e.sets, id)
	}
}

// setRoot checks a root given as a world rank against a set's members and
// returns its rank in the set.
func setRoot(id int32, ranks []int, root int) (int, error) {
	i := slices.Index(ranks, root)
	if i < 0 {
		if id == 0 {
			return 0, fmt.Errorf("%w: root rank %d outside the world of %d", ErrInvalid, root, len(ranks))
		}
		return 0, fmt.Errorf("%w: root rank %d is not a member of process set %d (ranks %v)", ErrInvalid, root, id, ranks)
	}
	return i, nil
}

// countsIn validates per-member element counts of a call on a set of n
// members and returns their sum.
func countsIn(what string, id int32, n int, counts []int) (int, error) {
	if len(counts) != n {
		if id == 0 {
			return 0, fmt.Errorf("%w: %s: %d counts for a world of %d", ErrInvalid, what, len(counts), n)
		}
		return 0, fmt.Errorf("%w: %s: %d counts for process set %d of %d ranks", ErrInvalid, what, len(counts), id, n)
	}
	total := 0
	for r, c := range counts {
		if c < 0 {
			return 0, fmt.Errorf("%w: %s: negative count %d for rank %d", ErrInvalid, what, c, r)
		}
		total += c
	}
	return total, nil
}

// runOn runs fn on one communicator through the session's failure handling.
type runOn func(ctx context.Context, fn func(ctx context.Context, c *collective.Communicator) error) error

// onSet is collectiveOn bound to a session and a set.
func (e *Engine) onSet(s *gsync.Session, id int32) runOn {
	return func(ctx context.Context, fn func(ctx context.Context, c *collective.Communicator) error) error {
		return e.collectiveOn(ctx, s, id, fn)
	}
}
