package gpu

import (
	"fmt"
	"slices"
	"strings"
)

// AssignError is an assignment that cannot be made.
type AssignError struct {
	Ranks, GPUs int
	Reason      string
}

func (e *AssignError) Error() string {
	return fmt.Sprintf("gpu: cannot assign GPUs to %d local workers (%d GPUs): %s", e.Ranks, e.GPUs, e.Reason)
}

// AssignDevices gives each of localRanks workers on this host its own GPU and
// returns, for local rank i, the value of CUDA_VISIBLE_DEVICES for that
// worker: the GPU's UUID, which names the same GPU whatever order CUDA
// enumerates devices in (NVML's indices follow PCI order, CUDA's default
// order does not). Each worker then sees its GPU as device 0.
//
// Ranks next to each other in the ring should be close: local rank i+1 gets
// the unassigned GPU best connected to rank i's (most direct NVLinks, then
// the nearest PCIe level, then the lower PCI bus id), starting from the GPU
// with the lowest PCI bus id. With fewer workers than GPUs, the first
// localRanks GPUs of that order are used, which keeps them close together.
// The result depends only on gpus, so every launcher on the host agrees.
//
// It fails with *AssignError when there are fewer GPUs than workers (gorovod
// does not share a GPU between workers) or a GPU has no UUID or a duplicate.
func AssignDevices(gpus []GPU, localRanks int) ([]string, error) {
	if localRanks < 0 {
		return nil, &AssignError{Ranks: localRanks, GPUs: len(gpus), Reason: "negative worker count"}
	}
	if localRanks > len(gpus) {
		return nil, &AssignError{Ranks: localRanks, GPUs: len(gpus), Reason: "fewer GPUs than workers; set fewer workers per host"}
	}
	seen := make(map[string]bool, len(gpus))
	for _, g := range gpus {
		if g.UUID == "" {
			return nil, &AssignError{Ranks: localRanks, GPUs: len(gpus), Reason: fmt.Sprintf("GPU %d has no UUID", g.Index)}
		}
		if seen[g.UUID] {
			return nil, &AssignError{Ranks: localRanks, GPUs: len(gpus), Reason: "duplicate GPU UUID " + g.UUID}
		}
		seen[g.UUID] = true
	}
	order := RingOrder(gpus)
	out := make([]string, localRanks)
	for i := range out {
		out[i] = order[i].UUID
	}
	return out, nil
}

// RingOrder returns gpus in the order AssignDevices hands them out.
func RingOrder(gpus []GPU) []GPU {
	if len(gpus) == 0 {
		return nil
	}
	left := slices.Clone(gpus)
	slices.SortFunc(left, func(a, b GPU) int {
		if c := strings.Compare(a.PCIBusID, b.PCIBusID); c != 0 {
			return c
		}
		return a.Index - b.Index
	})
	order := []GPU{left[0]}
	left = left[1:]
	for len(left) > 0 {
		cur := order[len(order)-1]
		best := 0
		for i := 1; i < len(left); i++ {
			if closer(cur, left[i], left[best]) {
				best = i
			}
		}
		order = append(order, left[best])
		left = slices.Delete(left, best, best+1)
	}
	return order
}

// closer reports whether a is better connected to from than b is; left is
// sorted by bus id, so ties keep the earlier GPU.
func closer(from, a, b GPU) bool {
	la, lb := linkTo(from, a), linkTo(from, b)
	if la.Level != lb.Level {
		return lb.Level.worse(la.Level)
	}
	return la.NVLinks > lb.NVLinks
}

func linkTo(from, to GPU) Link {
	if l, ok := from.Links[to.UUID]; ok {
		return l
	}
	return Link{Level: LevelUnknown}
}
