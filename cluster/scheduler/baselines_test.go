package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestPlacement(t *testing.T) {
	for _, tc := range []struct {
		nodes []int
		want  []int
	}{
		{nil, nil},
		{[]int{3}, []int{1}},
		{[]int{0, 0, 0, 0}, []int{4}},
		{[]int{5, 5, 2, 2, 2}, []int{2, 3}},
		{[]int{1, 2, 1}, []int{1, 1, 1}},
	} {
		if got := Placement(tc.nodes); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Placement(%v) = %v, want %v", tc.nodes, got, tc.want)
		}
	}
}

// round is one call of a policy in a scripted scenario.
type round struct {
	now  time.Duration
	jobs []Job
	want Allocation
}

func runRounds(t *testing.T, p Policy, cluster Cluster, rounds []round) {
	t.Helper()
	var current Allocation
	for i, r := range rounds {
		got, err := p.Allocate(context.Background(), r.now, r.jobs, cluster, current)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(r.want) {
			t.Fatalf("round %d: got %v, want %v", i, got, r.want)
		}
		current = got
	}
}

func TestTiresias(t *testing.T) {
	a := Job{ID: "a", Replicas: 3}
	b := Job{ID: "b", Replicas: 4}
	c := Job{ID: "c", Replicas: 2}
	d := Job{ID: "d", Replicas: 6}
	for _, tc := range []struct {
		name      string
		threshold time.Duration
		cluster   Cluster
		rounds    []round
	}{
		{
			// 8 GPUs: a (3) and b (4) fit, c (2) waits; the two-queue
			// scheme admits in arrival order and skips what does not fit.
			name: "first come first served, packed", cluster: NewCluster(2, 4),
			rounds: []round{
				{60 * time.Second, []Job{a, b, c}, Allocation{"a": {0, 0, 0}, "b": {1, 1, 1, 1}}},
				// a finishes: c gets the most free node, b keeps its place.
				{120 * time.Second, []Job{b, c}, Allocation{"b": {1, 1, 1, 1}, "c": {0, 0}}},
			},
		},
		{
			// a has run 100 s × 3 GPUs = 300 GPU·s ≥ 250: it drops to the
			// second queue, and d (6), still in the first, takes its place.
			name: "demotion preempts", threshold: 250 * time.Second, cluster: NewCluster(2, 4),
			rounds: []round{
				{0, []Job{a}, Allocation{"a": {0, 0, 0}}},
				{50 * time.Second, []Job{a, d}, Allocation{"a": {0, 0, 0}}},
				{100 * time.Second, []Job{a, d}, Allocation{"d": {0, 0, 0, 0, 1, 1}}},
			},
		},
		{
			name: "skip ahead to what fits", cluster: NewCluster(1, 8),
			rounds: []round{
				{0, []Job{b, d, c}, Allocation{"b": {0, 0, 0, 0}, "c": {0, 0}}},
			},
		},
		{
			// p and q may use only node 1: p, the earlier, is placed
			// there; q, whose nodes p fills, is not admitted (though
			// the cluster has room for it), and c takes node 0.
			name: "pinned jobs keep to their nodes, the earlier first", cluster: NewCluster(2, 2),
			rounds: []round{
				{0, []Job{
					{ID: "p", Replicas: 2, Eligible: []bool{false, true}},
					{ID: "q", Replicas: 2, Eligible: []bool{false, true}},
					{ID: "c", Replicas: 2},
				}, Allocation{"c": {0, 0}, "p": {1, 1}}},
			},
		},
		{
			// c runs on node 0, the only node p may use: c, free to go
			// anywhere, moves to node 1 rather than keep p waiting.
			name: "a pinned job's node is freed by a job that may move", cluster: NewCluster(2, 2),
			rounds: []round{
				{0, []Job{{ID: "c", Replicas: 2}}, Allocation{"c": {0, 0}}},
				{60 * time.Second, []Job{{ID: "c", Replicas: 2}, {ID: "p", Replicas: 2, Eligible: []bool{true}}},
					Allocation{"c": {1, 1}, "p": {0, 0}}},
			},
		},
		{
			// p prefers node 2 (weight 50), then node 1 (10): it is
			// packed on node 2; q prefers node 2 too, which p fills, so
			// q is packed on its next best node, 1; r has no
			// preference and gets what is left. Sizes are what they
			// ask for either way.
			name: "preferred nodes, then the others when they are full", cluster: NewCluster(3, 2),
			rounds: []round{
				{0, []Job{
					{ID: "p", Replicas: 2, Preference: []int{0, 10, 50}},
					{ID: "q", Replicas: 2, Preference: []int{0, 10, 50}},
					{ID: "r", Replicas: 2},
				}, Allocation{"p": {2, 2}, "q": {1, 1}, "r": {0, 0}}},
			},
		},
		{
			// p may use nodes 0 and 1 only: its preference for node 2
			// does not make node 2 usable; of its nodes it prefers 1.
			name: "a preference within the eligible nodes", cluster: NewCluster(3, 2),
			rounds: []round{
				{0, []Job{{ID: "p", Replicas: 2, Eligible: []bool{true, true, false}, Preference: []int{0, 1, 100}}},
					Allocation{"p": {1, 1}}},
			},
		},
		{
			// A running job is not moved to a node it prefers.
			name: "a running job stays where it is", cluster: NewCluster(2, 2),
			rounds: []round{
				{0, []Job{{ID: "p", Replicas: 2}}, Allocation{"p": {0, 0}}},
				{60 * time.Second, []Job{{ID: "p", Replicas: 2, Preference: []int{0, 100}}}, Allocation{"p": {0, 0}}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRounds(t, NewTiresias(TiresiasConfig{QueueThreshold: tc.threshold}), tc.cluster, tc.rounds)
		})
	}
}

// TestTiresiasGrowsBackAfterAShrink: a running job the runtime carried out
// on fewer GPUs than it asked for (the scheduler service's repair shrinks a
// running job to start a waiting one) is given its full size again once it
// fits, and kept where it is while it cannot (admitted, so its placement is
// what the policy proposes; the repair keeps it at its minimum otherwise).
func TestTiresiasGrowsBackAfterAShrink(t *testing.T) {
	a := Job{ID: "a", Replicas: 4}
	b := Job{ID: "b", Replicas: 4}
	for _, tc := range []struct {
		name    string
		jobs    []Job
		current Allocation
		want    Allocation
	}{
		// b has finished: a, shrunk to 3 beside it, is given its 4.
		{"room again", []Job{a}, Allocation{"a": {0, 0, 1}}, Allocation{"a": {0, 0, 1, 1}}},
		// b still holds its GPU: a is admitted at 4 (b, not admitted,
		// is left to the runtime's repair), packed anew.
		{"still shared", []Job{a, b}, Allocation{"a": {0, 0, 1}, "b": {1}}, Allocation{"a": {0, 0, 1, 1}}},
		// At its size a job stays where it is.
		{"at its size", []Job{a}, Allocation{"a": {0, 1, 1, 0}}, Allocation{"a": {0, 1, 1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewTiresias(TiresiasConfig{})
			got, err := p.Allocate(context.Background(), time.Minute, tc.jobs, NewCluster(2, 2), tc.current)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTiresiasErrors(t *testing.T) {
	_, err := NewTiresias(TiresiasConfig{}).Allocate(context.Background(), 0, []Job{{ID: "a"}}, NewCluster(1, 4), nil)
	if !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("a job without Replicas: got %v, want ErrInvalidJob", err)
	}
}

func TestOptimus(t *testing.T) {
	perfect := func(t0 float64) func(int) float64 { return func(r int) float64 { return t0 / float64(r) } }
	flat := func(r int) float64 { return 5 }
	for _, tc := range []struct {
		name    string
		cluster Cluster
		rounds  []round
	}{
		{
			// Both start at 1; gains (10−5)·100 = 500 for a, 0 for b;
			// then a at 2: (5−3.33)·100 = 167 > 0: a gets all the rest.
			name: "marginal gain", cluster: NewCluster(1, 4),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100},
				{ID: "b", StepTime: flat, RemainingSteps: 100},
			}, Allocation{"a": {0, 0, 0}, "b": {0}}}},
		},
		{
			// Remaining work weighs the gain: b, with 10× the steps
			// left, wins the GPUs a and b compete for.
			name: "remaining steps", cluster: NewCluster(1, 4),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 10},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100},
			}, Allocation{"a": {0}, "b": {0, 0, 0}}}},
		},
		{
			name: "max replicas and a job that gets nothing", cluster: NewCluster(1, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 1},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100},
				{ID: "c", StepTime: perfect(10), RemainingSteps: 100},
			}, Allocation{"a": {0}, "b": {0}}}},
		},
		{
			// Sizes unchanged keep their nodes; a grows and is packed
			// onto the node with most room, smallest jobs first.
			name: "placement", cluster: NewCluster(3, 4),
			rounds: []round{
				{0, []Job{
					{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2},
					{ID: "b", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 5},
				}, Allocation{"a": {0, 0}, "b": {1, 1, 1, 1, 2}}},
				{60 * time.Second, []Job{
					{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 3},
					{ID: "b", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 5},
				}, Allocation{"a": {0, 0, 0}, "b": {1, 1, 1, 1, 2}}},
			},
		},
		{
			// a and b may use only node 1: each gets one replica there,
			// and the GPU a would have grown onto goes to c instead.
			name: "pinned jobs capped at their nodes", cluster: NewCluster(2, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, Eligible: []bool{false, true}},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, Eligible: []bool{false, true}},
				{ID: "c", StepTime: perfect(10), RemainingSteps: 100},
			}, Allocation{"a": {1}, "b": {1}, "c": {0, 0}}}},
		},
		{
			// a and b both need node 0's two GPUs: a, the earlier, has
			// them; b gets nothing (the cluster's count had room for
			// it); c, free to go anywhere, is placed off node 0.
			name: "the earlier pinned job keeps its nodes", cluster: NewCluster(3, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MinReplicas: 2, MaxReplicas: 2, Eligible: []bool{true}},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100, MinReplicas: 2, MaxReplicas: 2, Eligible: []bool{true}},
				{ID: "c", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2},
			}, Allocation{"a": {0, 0}, "c": {1, 1}}}},
		},
		{
			// a and b both prefer node 1 and get 2 replicas each, as
			// without preferences: a, first in the placement order,
			// has node 1, b the other.
			name: "a preferred node, then the others when it is full", cluster: NewCluster(2, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, Preference: []int{0, 100}},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, Preference: []int{0, 100}},
			}, Allocation{"a": {1, 1}, "b": {0, 0}}}},
		},
		{
			// The summed weights rank the nodes: 2 (60) over 1 (40)
			// over 0; a is packed from node 2, and its third replica
			// goes to node 1, not to node 0 with more room.
			name: "nodes ranked by their summed weights", cluster: NewCluster(3, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 3, Preference: []int{0, 40, 60}},
			}, Allocation{"a": {2, 2, 1}}}},
		},
		{
			// A preference does not make a node eligible: a may use
			// node 0 only.
			name: "a preference within the eligible nodes", cluster: NewCluster(2, 2),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, Eligible: []bool{true, false}, Preference: []int{0, 100}},
			}, Allocation{"a": {0, 0}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRounds(t, NewOptimus(), tc.cluster, tc.rounds)
		})
	}
}

// TestBaselinesMaxPerNode: Tiresias and Optimus keep a job's cap per node
// (Job.MaxPerNode) in their packing; without the cap each row's job would be
// packed on one node.
func TestBaselinesMaxPerNode(t *testing.T) {
	perfect := func(t0 float64) func(int) float64 { return func(r int) float64 { return t0 / float64(r) } }
	for _, tc := range []struct {
		name    string
		policy  func() Policy
		cluster Cluster
		rounds  []round
	}{
		{
			name: "tiresias: one per node", policy: func() Policy { return NewTiresias(TiresiasConfig{}) }, cluster: NewCluster(2, 4),
			rounds: []round{{0, []Job{{ID: "p", Replicas: 2, MaxPerNode: 1}}, Allocation{"p": {0, 1}}}},
		},
		{
			// p's 3 replicas at one a node need 3 nodes: it is not
			// admitted, and c is packed.
			name: "tiresias: a job its nodes cannot hold at its cap waits", policy: func() Policy { return NewTiresias(TiresiasConfig{}) }, cluster: NewCluster(2, 4),
			rounds: []round{{0, []Job{{ID: "p", Replicas: 3, MaxPerNode: 1}, {ID: "c", Replicas: 2}}, Allocation{"c": {0, 0}}}},
		},
		{
			// c holds node 0; p needs a GPU on each node: c, free to
			// go anywhere, makes room for it.
			name: "tiresias: a capped job's room is freed by a job that may move", policy: func() Policy { return NewTiresias(TiresiasConfig{}) }, cluster: NewCluster(2, 2),
			rounds: []round{
				{0, []Job{{ID: "c", Replicas: 2}}, Allocation{"c": {0, 0}}},
				{60 * time.Second, []Job{{ID: "c", Replicas: 2}, {ID: "p", Replicas: 2, MaxPerNode: 1}}, Allocation{"c": {0, 1}, "p": {0, 1}}},
			},
		},
		{
			// A running job keeps its nodes, within its cap.
			name: "tiresias: a running job within its cap stays", policy: func() Policy { return NewTiresias(TiresiasConfig{}) }, cluster: NewCluster(3, 4),
			rounds: []round{
				{0, []Job{{ID: "p", Replicas: 4, MaxPerNode: 2}}, Allocation{"p": {0, 0, 1, 1}}},
				{60 * time.Second, []Job{{ID: "p", Replicas: 4, MaxPerNode: 2}}, Allocation{"p": {0, 0, 1, 1}}},
			},
		},
		{
			name: "optimus: one per node", policy: func() Policy { return NewOptimus() }, cluster: NewCluster(2, 2),
			rounds: []round{{0, []Job{{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxReplicas: 2, MaxPerNode: 1}}, Allocation{"a": {0, 1}}}},
		},
		{
			// a stops growing at one a node; b, without a cap, gets
			// the GPUs a would have taken.
			name: "optimus: a capped job grows only as far as its cap", policy: func() Policy { return NewOptimus() }, cluster: NewCluster(2, 4),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MaxPerNode: 1},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100},
			}, Allocation{"a": {0, 1}, "b": {0, 0, 0, 1, 1, 1}}}},
		},
		{
			name: "optimus: a minimum its nodes cannot hold at its cap waits", policy: func() Policy { return NewOptimus() }, cluster: NewCluster(2, 4),
			rounds: []round{{0, []Job{
				{ID: "a", StepTime: perfect(10), RemainingSteps: 100, MinReplicas: 3, MaxPerNode: 1},
				{ID: "b", StepTime: perfect(10), RemainingSteps: 100},
			}, Allocation{"b": {0, 0, 0, 0, 1, 1, 1, 1}}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runRounds(t, tc.policy(), tc.cluster, tc.rounds)
		})
	}
}
