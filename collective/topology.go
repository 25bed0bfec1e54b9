package collective

import (
	"net"

	"github.com/gorovod/gorovod/collective/transport"
)

// Topology is where a world's ranks run: which of them share a host. The
// communicator derives it from the world (transport.World.Hosts, or the host
// part of each rank's address) and uses it to lay out its rings and to run
// the hierarchical algorithms.
type Topology struct {
	// Hosts is the host index of every rank; hosts are numbered in the
	// order of their lowest rank.
	Hosts []int
	// HostRanks lists the ranks of every host, ascending.
	HostRanks [][]int
	// LocalRank is this rank's position among its host's ranks, LocalSize
	// their number.
	LocalRank, LocalSize int
	// CrossRank is this rank's position among the ranks with its LocalRank
	// (one per host that has that many ranks, in host order), CrossSize
	// their number — Horovod's cross rank and size.
	CrossRank, CrossSize int
}

// NumHosts is the number of hosts.
func (t Topology) NumHosts() int { return len(t.HostRanks) }

// Uniform reports whether every host runs the same number of ranks.
func (t Topology) Uniform() bool {
	for _, rs := range t.HostRanks {
		if len(rs) != len(t.HostRanks[0]) {
			return false
		}
	}
	return true
}

// minLocal is the fewest ranks any host runs.
func (t Topology) minLocal() int {
	m := len(t.Hosts)
	for _, rs := range t.HostRanks {
		m = min(m, len(rs))
	}
	return m
}

// maxLocal is the most ranks any host runs.
func (t Topology) maxLocal() int {
	m := 0
	for _, rs := range t.HostRanks {
		m = max(m, len(rs))
	}
	return m
}

// hostName is the host a world names for rank r.
func hostName(w transport.World, r int) string {
	if len(w.Hosts) != 0 {
		return w.Hosts[r]
	}
	if h, _, err := net.SplitHostPort(w.Addrs[r]); err == nil {
		return h
	}
	return w.Addrs[r]
}

// topologyOf computes the topology of w as seen by w.Rank.
func topologyOf(w transport.World) Topology {
	p := w.Size()
	t := Topology{Hosts: make([]int, p)}
	index := map[string]int{}
	for r := range p {
		name := hostName(w, r)
		h, ok := index[name]
		if !ok {
			h = len(t.HostRanks)
			index[name] = h
			t.HostRanks = append(t.HostRanks, nil)
		}
		t.Hosts[r] = h
		t.HostRanks[h] = append(t.HostRanks[h], r)
	}
	mine := t.HostRanks[t.Hosts[w.Rank]]
	t.LocalSize = len(mine)
	for i, r := range mine {
		if r == w.Rank {
			t.LocalRank = i
		}
	}
	for h, rs := range t.HostRanks {
		if len(rs) > t.LocalRank {
			if h == t.Hosts[w.Rank] {
				t.CrossRank = t.CrossSize
			}
			t.CrossSize++
		}
	}
	return t
}

// groups are the rank orders the algorithms run over, computed once per
// communicator so that running them allocates nothing.
type groups struct {
	// flat is the ring over every rank, each host's ranks adjacent (hosts
	// in order, ranks ascending within each), so that a flat ring crosses
	// each host's link once in each direction.
	flat ringGroup
	// local is the ring over this host's ranks; cross the ring over the
	// ranks with this rank's local index on the hosts that have at least
	// minLocal ranks (every host), in host order. cross is empty for ranks
	// whose local index is minLocal or more: they take no part in the
	// hierarchical allreduce's exchange between hosts.
	local, cross ringGroup
	// minLocal is the fewest ranks a host runs: the number of stripes of a
	// hierarchical allreduce.
	minLocal int
	// flatPos is every rank's position in flat, hostStart the position of
	// each host's first rank there and hostSize its number of ranks: the
	// broadcasts' order (broadcastOrder) is made of them.
	flatPos, hostStart, hostSize []int
	// host is every rank's host (Topology.Hosts).
	host []int
}

// ringGroup is a ring of ranks an algorithm runs over: ranks in ring order,
// this rank's position in it (-1: not in it), and, when not nil, the plan
// segment each position owns (nil: its position).
type ringGroup struct {
	ranks []int
	segs  []int
	pos   int
}

func (g *ringGroup) size() int { return len(g.ranks) }

func (g *ringGroup) seg(q int) int {
	if g.segs == nil {
		return q
	}
	return g.segs[q]
}

func newGroups(t Topology, rank int) groups {
	var g groups
	p := len(t.Hosts)
	g.flat.ranks = make([]int, 0, p)
	for _, rs := range t.HostRanks {
		g.flat.ranks = append(g.flat.ranks, rs...)
	}
	g.flat.segs = g.flat.ranks
	g.flatPos = make([]int, p)
	for q, r := range g.flat.ranks {
		g.flatPos[r] = q
	}
	g.flat.pos = g.flatPos[rank]
	g.host = t.Hosts
	g.hostStart = make([]int, len(t.HostRanks))
	g.hostSize = make([]int, len(t.HostRanks))
	for h, rs := range t.HostRanks {
		g.hostStart[h], g.hostSize[h] = g.flatPos[rs[0]], len(rs)
	}
	g.local = ringGroup{ranks: t.HostRanks[t.Hosts[rank]], pos: t.LocalRank}
	g.minLocal = t.minLocal()
	g.cross.pos = -1
	if t.LocalRank < g.minLocal {
		for h, rs := range t.HostRanks {
			if h == t.Hosts[rank] {
				g.cross.pos = len(g.cross.ranks)
			}
			g.cross.ranks = append(g.cross.ranks, rs[t.LocalRank])
		}
	}
	return g
}
