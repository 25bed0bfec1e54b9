package scheduler

import (
	"fmt"
	"slices"
	"testing"
)

func TestRepairToMinimums(t *testing.T) {
	for _, tc := range []struct {
		name    string
		want    []int
		floor   []int
		running []bool
		slots   int
		out     []int
	}{
		{"fits: unchanged", []int{2, 1, 1}, []int{1, 1, 1}, []bool{true, true, false}, 4, []int{2, 1, 1}},
		{"a running job keeps its floor", []int{4, 0}, []int{1, 1}, []bool{true, true}, 4, []int{3, 1}},
		{"a queued job below its floor waits", []int{3, 1}, []int{1, 2}, []bool{true, false}, 4, []int{3, 0}},
		{"the last queued job gives way first", []int{0, 2, 2}, []int{2, 1, 1}, []bool{true, false, false}, 4, []int{2, 2, 0}},
		{"then the running job furthest above its floor", []int{1, 4, 1}, []int{1, 1, 1}, []bool{true, true, true}, 4, []int{1, 2, 1}},
		{"floors of two", []int{0, 0}, []int{2, 2}, []bool{true, true}, 4, []int{2, 2}},
		{"lost nodes: the last running job waits", []int{2, 2}, []int{2, 2}, []bool{true, true}, 2, []int{2, 0}},
		{"no slots at all", []int{1, 1}, []int{1, 1}, []bool{true, false}, 0, []int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Clone(tc.want)
			RepairToMinimums(got, tc.floor, tc.running, tc.slots)
			if !slices.Equal(got, tc.out) {
				t.Errorf("RepairToMinimums(%v, floors %v, running %v, %d slots) = %v, want %v", tc.want, tc.floor, tc.running, tc.slots, got, tc.out)
			}
			if sum(got) > tc.slots {
				t.Errorf("%d slots allocated of %d", sum(got), tc.slots)
			}
		})
	}
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

func TestAdmitByPriority(t *testing.T) {
	for _, tc := range []struct {
		name    string
		want    []int
		floor   []int
		running []bool
		slots   int
		out     []int
	}{
		{"idle slots admit a waiting job at its floor", []int{1, 0}, []int{1, 2}, []bool{true, false}, 4, []int{1, 2}},
		{"the important job displaces a less important starter", []int{1, 0, 3}, []int{1, 2, 2}, []bool{true, false, false}, 4, []int{1, 2, 0}},
		{"running jobs shrink to their floors for it", []int{3, 0}, []int{1, 2}, []bool{true, false}, 4, []int{2, 2}},
		{"a floor that cannot fit waits, the next is admitted", []int{2, 0, 0}, []int{2, 3, 1}, []bool{true, false, false}, 4, []int{2, 0, 1}},
		{"nothing to do", []int{2, 2}, []int{1, 1}, []bool{true, true}, 4, []int{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Clone(tc.want)
			AdmitByPriority(got, tc.floor, tc.running, tc.slots)
			if !slices.Equal(got, tc.out) {
				t.Errorf("AdmitByPriority(%v, floors %v, running %v, %d slots) = %v, want %v", tc.want, tc.floor, tc.running, tc.slots, got, tc.out)
			}
			if sum(got) > tc.slots {
				t.Errorf("%d slots allocated of %d", sum(got), tc.slots)
			}
		})
	}
}

func TestPlaceCounts(t *testing.T) {
	cluster := NewCluster(2, 2)
	ids := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name              string
		counts            map[string]int
		proposed, current Allocation
		want              Allocation
		eligible          map[string][]bool
		preference        map[string][]int
	}{
		{"the policy's placement is kept",
			map[string]int{"a": 2, "b": 1, "c": 1}, Allocation{"a": {1, 1}, "b": {0}, "c": {0}}, nil,
			Allocation{"a": {1, 1}, "b": {0}, "c": {0}}, nil, nil},
		{"a repaired count is packed on the freest node",
			map[string]int{"a": 1, "b": 2}, Allocation{"a": {1}, "b": {0, 0, 1}}, nil,
			Allocation{"a": {1}, "b": {0, 0}}, nil, nil},
		{"a job the policy left out",
			map[string]int{"a": 3, "c": 1}, Allocation{"a": {0, 0, 1}}, nil,
			Allocation{"a": {0, 0, 1}, "c": {1}}, nil, nil},
		{"a job keeps its current nodes",
			map[string]int{"a": 1, "b": 2}, Allocation{}, Allocation{"b": {1, 1}},
			Allocation{"a": {0}, "b": {1, 1}}, nil, nil},
		{"a shrinking job leaves its emptiest node",
			map[string]int{"a": 2}, Allocation{}, Allocation{"a": {0, 1, 1}},
			Allocation{"a": {1, 1}}, nil, nil},
		{"a proposal over a node's capacity is not kept",
			map[string]int{"a": 2, "b": 1}, Allocation{"a": {0, 0}, "b": {0}}, Allocation{"b": {0}},
			Allocation{"a": {0, 0}, "b": {1}}, nil, nil},
		{"a proposal outside the job's nodes is not kept",
			map[string]int{"a": 2}, Allocation{"a": {0, 0}}, nil,
			Allocation{"a": {1, 1}}, map[string][]bool{"a": {false, true}}, nil},
		{"a job keeps only its current nodes that are eligible",
			map[string]int{"a": 2}, Allocation{}, Allocation{"a": {0, 1}},
			Allocation{"a": {1, 1}}, map[string][]bool{"a": {false, true}}, nil},
		{"a pinned job is placed before one free to go anywhere",
			map[string]int{"a": 2, "b": 2}, Allocation{}, Allocation{"a": {1}},
			Allocation{"a": {0, 0}, "b": {1, 1}}, map[string][]bool{"b": {false, true}}, nil},
		{"a pinned job gets what its nodes hold",
			map[string]int{"a": 3}, Allocation{}, nil,
			Allocation{"a": {1, 1}}, map[string][]bool{"a": {false, true}}, nil},
		{"a node beyond the eligible set's end is not eligible",
			map[string]int{"a": 1}, Allocation{"a": {1}}, nil,
			Allocation{"a": {0}}, map[string][]bool{"a": {true}}, nil},
		{"a repaired count is packed on the preferred node",
			map[string]int{"a": 2}, Allocation{"a": {0}}, nil,
			Allocation{"a": {1, 1}}, nil, map[string][]int{"a": {0, 10}}},
		{"the preferred node of a larger summed weight",
			map[string]int{"a": 1}, Allocation{}, nil,
			Allocation{"a": {1}}, nil, map[string][]int{"a": {30, 31}}},
		{"a preference does not make a node eligible",
			map[string]int{"a": 2}, Allocation{}, nil,
			Allocation{"a": {0, 0}}, map[string][]bool{"a": {true, false}}, map[string][]int{"a": {0, 100}}},
		{"a preferred node that is full: the others",
			map[string]int{"a": 2, "b": 2}, Allocation{"b": {1, 1}}, nil,
			Allocation{"a": {0, 0}, "b": {1, 1}}, nil, map[string][]int{"a": {0, 100}}},
		{"a preferred node partly full: what it holds, then the others",
			map[string]int{"a": 2, "b": 1}, Allocation{"b": {1}}, nil,
			Allocation{"a": {0, 1}, "b": {1}}, nil, map[string][]int{"a": {0, 100}}},
		{"a proposal that fits is kept whatever its score",
			map[string]int{"a": 2}, Allocation{"a": {0, 0}}, nil,
			Allocation{"a": {0, 0}}, nil, map[string][]int{"a": {0, 100}}},
		{"a shrinking job leaves its node of lowest score",
			map[string]int{"a": 2}, Allocation{}, Allocation{"a": {0, 0, 1}},
			Allocation{"a": {0, 1}}, nil, map[string][]int{"a": {0, 5}}},
		{"a growing job takes a preferred free node before its own",
			map[string]int{"a": 3}, Allocation{}, Allocation{"a": {0}},
			Allocation{"a": {0, 1, 1}}, nil, map[string][]int{"a": {0, 5}}},
		{"a running job stays off its preferred node",
			map[string]int{"a": 1}, Allocation{}, Allocation{"a": {0}},
			Allocation{"a": {0}}, nil, map[string][]int{"a": {0, 5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlaceCounts(cluster, ids, tc.counts, tc.proposed, tc.current, tc.eligible, tc.preference, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("PlaceCounts = %v, want %v", got, tc.want)
			}
			for id, nodes := range tc.want {
				if !slices.Equal(got[id], nodes) {
					t.Errorf("PlaceCounts = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// TestPlaceCountsMaxPerNode: a job's cap per node (maxPerNode, as
// Job.MaxPerNode) holds in each of PlaceCounts' steps.
func TestPlaceCountsMaxPerNode(t *testing.T) {
	cluster := NewCluster(3, 2)
	ids := []string{"a", "b", "c"}
	for _, tc := range []struct {
		name              string
		counts            map[string]int
		proposed, current Allocation
		maxPerNode        map[string]int
		eligible          map[string][]bool
		preference        map[string][]int
		want              Allocation
	}{
		{"a proposal over the cap is not kept",
			map[string]int{"a": 2}, Allocation{"a": {0, 0}}, nil, map[string]int{"a": 1}, nil, nil,
			Allocation{"a": {0, 1}}},
		{"a proposal within the cap is kept",
			map[string]int{"a": 2}, Allocation{"a": {2, 2}}, nil, map[string]int{"a": 2}, nil, nil,
			Allocation{"a": {2, 2}}},
		{"a job keeps its current workers up to the cap",
			map[string]int{"a": 2}, Allocation{}, Allocation{"a": {1, 1}}, map[string]int{"a": 1}, nil, nil,
			Allocation{"a": {0, 1}}},
		{"a growing job moves on at the cap",
			map[string]int{"a": 3}, Allocation{}, nil, map[string]int{"a": 1}, nil, nil,
			Allocation{"a": {0, 1, 2}}},
		{"a capped job gets what its nodes hold at the cap",
			map[string]int{"a": 4}, Allocation{}, nil, map[string]int{"a": 1}, nil, nil,
			Allocation{"a": {0, 1, 2}}},
		{"a capped job is placed before one free to go anywhere",
			map[string]int{"a": 4, "b": 2}, Allocation{}, nil, map[string]int{"b": 1}, nil, nil,
			Allocation{"a": {0, 1, 2, 2}, "b": {0, 1}}},
		{"the preferred nodes at the cap, then the others",
			map[string]int{"a": 2}, Allocation{}, nil, map[string]int{"a": 1}, nil, map[string][]int{"a": {0, 0, 100}},
			Allocation{"a": {0, 2}}},
		{"the eligible nodes at the cap",
			map[string]int{"a": 2}, Allocation{"a": {1, 1}}, nil, map[string]int{"a": 1}, map[string][]bool{"a": {false, true, true}}, nil,
			Allocation{"a": {1, 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlaceCounts(cluster, ids, tc.counts, tc.proposed, tc.current, tc.eligible, tc.preference, tc.maxPerNode)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("PlaceCounts = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestKeepOneCurrent: a running job the policy moves wholly to other nodes
// keeps one of its current slots (its workers hold the training state), and
// gets it before another job's proposal takes it — the move seen on two
// kubelets, where job b went from node 1 ×2 to node 0 ×1 while c took node 1.
func TestKeepOneCurrent(t *testing.T) {
	cluster := Cluster{GPUs: []int{2, 2}}
	for _, tc := range []struct {
		name              string
		counts            map[string]int
		proposed, current Allocation
		want              Allocation
	}{
		{"moved wholly", map[string]int{"a": 1, "b": 1, "c": 2},
			Allocation{"a": {0}, "b": {0}, "c": {1, 1}}, Allocation{"a": {0, 0}, "b": {1, 1}},
			Allocation{"a": {0}, "b": {1}, "c": {0, 1}}},
		{"kept a node", map[string]int{"a": 2, "b": 2},
			Allocation{"a": {0, 0}, "b": {1, 1}}, Allocation{"a": {0}, "b": {0, 1}},
			Allocation{"a": {0, 0}, "b": {1, 1}}},
		{"new job", map[string]int{"a": 2, "n": 2},
			Allocation{"a": {0, 0}, "n": {1, 1}}, Allocation{"a": {0, 0}},
			Allocation{"a": {0, 0}, "n": {1, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := []string{"a", "b", "c", "n"}
			proposed, order := KeepOneCurrent(ids, tc.counts, tc.proposed, tc.current)
			got := PlaceCounts(cluster, order, tc.counts, proposed, tc.current, nil, nil, nil)
			for id, want := range tc.want {
				if !slices.Equal(got[id], want) {
					t.Errorf("%s placed on %v, want %v (all: %v)", id, got[id], want, got)
				}
			}
			for id, cur := range tc.current {
				if tc.counts[id] > 0 && !slices.ContainsFunc(got[id], func(n int) bool { return slices.Contains(cur, n) }) {
					t.Errorf("%s moved wholly from %v to %v", id, cur, got[id])
				}
			}
		})
	}
}
