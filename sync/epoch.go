package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Member is one worker of a world epoch.
type Member struct {
	Name string // unique per worker incarnation
	Addr string // the worker's collective transport address
}

// Epoch is one agreed world: its number and its members in rank order.
type Epoch struct {
	Number  uint64
	Members []Member
}

// Rank returns name's rank in the epoch, or -1.
func (e Epoch) Rank(name string) int {
	return slices.IndexFunc(e.Members, func(m Member) bool { return m.Name == name })
}

// Addrs lists the members' collective addresses in rank order.
func (e Epoch) Addrs() []string {
	a := make([]string, len(e.Members))
	for i, m := range e.Members {
		a[i] = m.Addr
	}
	return a
}

func (e Epoch) String() string { return fmt.Sprintf("epoch %d (%d workers)", e.Number, len(e.Members)) }

// EpochSource is a worker's view of the agreed sequence of world epochs: the
// membership layer and its single proposer deliver them; the session only
// consumes them.
type EpochSource interface {
	// Latest is the number of the newest epoch this worker has been told of; it
	// must not block (the session asks at every step boundary).
	Latest() uint64
	// Await returns the newest epoch numbered above after, waiting for one.
	Await(ctx context.Context, after uint64) (Epoch, error)
	// ReportFailure tells the proposer that a collective of epoch failed,
	// naming the peer it blamed (-1 when none): it need not wait for gossip to
	// notice a dead or frozen worker.
	ReportFailure(epoch uint64, peer Member, cause error)
}

var (
	// ErrWorldChanged is returned by Session.Allreduce when the world broke
	// during the collective and was rebuilt, and by Session.Commit when the
	// step did not commit after all (the next world's rank 0 had not finished
	// it): the registered state has been made identical on every worker
	// (possibly rolled back to the start of the step), so the trainer
	// recomputes the step from the state it now holds.
	ErrWorldChanged = errors.New("sync: the world changed during the step; redo it")
	// ErrExcluded is returned when a newer epoch no longer includes this worker
	// (it was scaled down, or declared failed while it was unreachable).
	ErrExcluded = errors.New("sync: this worker is not a member of the current world")
)
