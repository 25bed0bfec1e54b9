package launch

import "fmt"

// Placement says on which CPUs each worker runs.
type Placement string

const (
	// PlaceAnywhere leaves the workers to the kernel's scheduler (the default).
	PlaceAnywhere Placement = "none"
	// PlaceBalanced pins each worker to its share of the launcher's CPUs:
	// with NP ≤ n, worker i of NP on the CPUs [i·n/NP, (i+1)·n/NP) of the n
	// CPUs the workers share, a block of its own; with more workers than
	// CPUs, worker i on CPU i mod n, so that ring neighbours (ranks i and
	// i+1) run on different CPUs and each step of a ring moves data between
	// cores that both work, instead of handing over from one rank to the
	// next on one core. Measured, 4 ranks on 2 cores, idle, interleaved
	// (5 runs each, twice): 256 KiB allreduce 1.06–1.12x faster over TCP
	// and 1.23–1.34x over shared memory than with ranks 0,1 and 2,3
	// together; 4 KiB, 4 MiB and 64 MiB within ±10 % (0.90–1.14x). Workers
	// added later take the place of worker i mod NP.
	//
	// The kernel balances busy processes over CPUs only from time to time,
	// and with more ranks than cores it often leaves two busy ranks on one
	// core and two waiting ones on the other: measured with 4 ranks on 2
	// cores (shared-memory allreduce, 4 MiB) as runs of either ≈2.0 or
	// ≈3.4 GB/s; pinned two per core, 3.3–3.5 in every run.
	PlaceBalanced Placement = "balanced"
)

// Placements lists the accepted placement names.
func Placements() []Placement { return []Placement{PlaceAnywhere, PlaceBalanced} }

// ParsePlacement reads a placement name ("" is PlaceAnywhere).
func ParsePlacement(s string) (Placement, error) {
	switch Placement(s) {
	case "", PlaceAnywhere:
		return PlaceAnywhere, nil
	case PlaceBalanced:
		return PlaceBalanced, nil
	}
	return "", fmt.Errorf("launch: unknown placement %q (want %q or %q)", s, PlaceAnywhere, PlaceBalanced)
}

// PlaceCPUs returns the CPUs worker i of np workers sharing cpus CPUs runs on
// under placement p: nil (anywhere) for PlaceAnywhere, its share of the first
// cpus CPUs this process may use for PlaceBalanced.
func PlaceCPUs(p Placement, i, np, cpus int) ([]int, error) {
	place, err := ParsePlacement(string(p))
	if err != nil || place == PlaceAnywhere {
		return nil, err
	}
	allowed, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	return balancedCPUs(i, max(1, np), allowed[:min(len(allowed), max(1, cpus))]), nil
}

// balancedCPUs returns the CPUs of worker i of np under PlaceBalanced, given
// the CPUs the workers share.
func balancedCPUs(i, np int, cpus []int) []int {
	n := len(cpus)
	slot := i % np
	if np > n {
		return cpus[slot%n : slot%n+1]
	}
	lo := slot * n / np
	hi := max(lo+1, (slot+1)*n/np)
	return cpus[lo:hi]
}
