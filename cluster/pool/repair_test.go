package pool

import (
	"slices"
	"testing"

	"github.com/gorovod/gorovod/cluster/scheduler"
)

func TestRepair(t *testing.T) {
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
		{"the newest queued job gives way first", []int{0, 2, 2}, []int{2, 1, 1}, []bool{true, false, false}, 4, []int{2, 2, 0}},
		{"then the running job furthest above its floor", []int{1, 4, 1}, []int{1, 1, 1}, []bool{true, true, true}, 4, []int{1, 2, 1}},
		{"floors of two", []int{0, 0}, []int{2, 2}, []bool{true, true}, 4, []int{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := slices.Clone(tc.want)
			repair(got, tc.floor, tc.running, tc.slots)
			if !slices.Equal(got, tc.out) {
				t.Errorf("repair(%v, floors %v, running %v, %d slots) = %v, want %v", tc.want, tc.floor, tc.running, tc.slots, got, tc.out)
			}
			sum := 0
			for _, n := range got {
				sum += n
			}
			if sum > tc.slots {
				t.Errorf("%d slots allocated of %d", sum, tc.slots)
			}
		})
	}
}

func TestPlace(t *testing.T) {
	cluster := scheduler.NewCluster(2, 2)
	jobs := []*entry{{spec: JobSpec{Name: "a"}}, {spec: JobSpec{Name: "b"}}, {spec: JobSpec{Name: "c"}}}
	for _, tc := range []struct {
		name     string
		counts   map[string]int
		proposed scheduler.Allocation
		want     scheduler.Allocation
	}{
		{"the policy's placement is kept",
			map[string]int{"a": 2, "b": 1, "c": 1}, scheduler.Allocation{"a": {1, 1}, "b": {0}, "c": {0}},
			scheduler.Allocation{"a": {1, 1}, "b": {0}, "c": {0}}},
		{"a repaired count goes to the freest node",
			map[string]int{"a": 1, "b": 2}, scheduler.Allocation{"a": {1}, "b": {0, 0, 1}},
			scheduler.Allocation{"a": {1}, "b": {0, 0}}},
		{"a job the policy left out",
			map[string]int{"a": 3, "c": 1}, scheduler.Allocation{"a": {0, 0, 1}},
			scheduler.Allocation{"a": {0, 0, 1}, "c": {1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := place(cluster, jobs, tc.counts, tc.proposed)
			if len(got) != len(tc.want) {
				t.Fatalf("place = %v, want %v", got, tc.want)
			}
			for id, nodes := range tc.want {
				if !slices.Equal(got[id], nodes) {
					t.Errorf("place = %v, want %v", got, tc.want)
				}
			}
		})
	}
}
