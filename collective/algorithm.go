package collective

import (
	"fmt"
	"slices"
	"strings"
)

// Algorithm names a collective algorithm a Config can force.
type Algorithm string

// The algorithms Config.Algorithm and Config.AllgatherAlgorithm accept.
const (
	// AlgorithmAuto chooses per call by size and topology (see Config).
	AlgorithmAuto Algorithm = "auto"
	// AlgorithmRing is the flat pipelined ring over every rank, each host's
	// ranks adjacent in it.
	AlgorithmRing Algorithm = "ring"
	// AlgorithmHierarchical runs inside each host first, then between the
	// hosts, then inside each host again: an allreduce reduce-scatters
	// inside the host, allreduces each stripe across hosts between the
	// ranks of one local index, and allgathers inside the host; an
	// allgather gathers across hosts between the ranks of one local index,
	// then inside the host.
	AlgorithmHierarchical Algorithm = "hierarchical"
	// AlgorithmRecursiveDoubling exchanges the whole buffer in log2 p
	// rounds (allreduce only): the fewest hops, for small messages.
	AlgorithmRecursiveDoubling Algorithm = "recursive-doubling"
)

// Algorithms lists the algorithm names, for usage messages.
func Algorithms() []Algorithm {
	return []Algorithm{AlgorithmAuto, AlgorithmRing, AlgorithmHierarchical, AlgorithmRecursiveDoubling}
}

// ParseAlgorithm parses an algorithm name, case-insensitively: "" is auto,
// "rd" recursive doubling, "hier" hierarchical.
func ParseAlgorithm(s string) (Algorithm, error) {
	a := Algorithm(strings.ToLower(strings.TrimSpace(s)))
	switch a {
	case "":
		return AlgorithmAuto, nil
	case "rd", "doubling":
		return AlgorithmRecursiveDoubling, nil
	case "hier":
		return AlgorithmHierarchical, nil
	}
	if slices.Contains(Algorithms(), a) {
		return a, nil
	}
	return "", fmt.Errorf("unknown algorithm %q (want one of %v)", s, Algorithms())
}

// Topology returns where the world's ranks run (a copy).
func (c *Communicator) Topology() Topology {
	t := c.topo
	t.Hosts = slices.Clone(t.Hosts)
	t.HostRanks = make([][]int, len(c.topo.HostRanks))
	for i, rs := range c.topo.HostRanks {
		t.HostRanks[i] = slices.Clone(rs)
	}
	return t
}

// hierarchical reports whether the world has a hierarchy worth using: more
// than one host, and some host with more than one rank.
func (t Topology) hierarchical() bool { return t.NumHosts() > 1 && t.maxLocal() > 1 }

// allreduceAlgo is the algorithm an allreduce of count elements (nbytes
// bytes) runs: the forced one, or by size and topology.
func (c *Communicator) allreduceAlgo(nbytes, count int) uint8 {
	switch c.algorithm {
	case AlgorithmRing:
		return algoRing
	case AlgorithmHierarchical:
		return algoHierarchical
	case AlgorithmRecursiveDoubling:
		return algoRecursiveDoubling
	}
	switch {
	case nbytes <= c.cfg.SmallMessageBytes || count < c.Size():
		return algoRecursiveDoubling
	case c.cfg.HierarchicalBytes >= 0 && nbytes >= c.cfg.HierarchicalBytes && c.topo.hierarchical():
		return algoHierarchical
	}
	return algoRing
}

// allgatherAlgorithm is the algorithm an allgather runs: the ring unless the
// hierarchical one is forced and every host runs the same number of ranks
// (the gather between hosts pairs the ranks of one local index).
func (c *Communicator) allgatherAlgorithm() uint8 {
	if c.allgatherAlgo == AlgorithmHierarchical && c.topo.NumHosts() > 1 && c.topo.Uniform() {
		return algoHierarchical
	}
	return algoRing
}

// AllreduceAlgorithm names the algorithm an allreduce of count elements of
// dt runs on this communicator (as OpInfo.Algorithm names it).
func (c *Communicator) AllreduceAlgorithm(dt DType, count int) string {
	return algoName(c.allreduceAlgo(count*dt.Size(), count))
}

// AllgatherAlgorithm names the algorithm an allgather runs on this
// communicator.
func (c *Communicator) AllgatherAlgorithm() string { return algoName(c.allgatherAlgorithm()) }

// ChunkBytes is the pipelining unit this communicator's rings and chains
// run with: Config.ChunkBytes, or what it chose when that was 0.
func (c *Communicator) ChunkBytes() int { return c.cfg.ChunkBytes }
