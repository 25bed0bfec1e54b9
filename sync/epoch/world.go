package epoch

import (
	"context"
	"fmt"
	"slices"
)

// Member is one worker of a world.
type Member struct {
	Name string // unique per worker incarnation
	Addr string // the worker's collective transport address
}

// World is one agreed world epoch: its number and its members in rank order.
type World struct {
	Number  uint64
	Members []Member
}

// Rank returns name's rank in the world, or -1.
func (w World) Rank(name string) int {
	return slices.IndexFunc(w.Members, func(m Member) bool { return m.Name == name })
}

// Addrs lists the members' collective addresses in rank order.
func (w World) Addrs() []string {
	a := make([]string, len(w.Members))
	for i, m := range w.Members {
		a[i] = m.Addr
	}
	return a
}

func (w World) String() string { return fmt.Sprintf("epoch %d (%d workers)", w.Number, len(w.Members)) }

// Source is a worker's view of the agreed sequence of world epochs: the
// membership layer and its single proposer deliver them; the session only
// consumes them.
type Source interface {
	// Latest is the number of the newest epoch this worker has been told of; it
	// must not block (the session asks at every step boundary).
	Latest() uint64
	// Await returns the newest epoch numbered above after, waiting for one.
	Await(ctx context.Context, after uint64) (World, error)
	// ReportFailure tells the proposer that a collective of epoch failed,
	// naming the peer it blamed (-1 when none): it need not wait for gossip to
	// notice a dead or frozen worker.
	ReportFailure(epoch uint64, peer Member, cause error)
}
