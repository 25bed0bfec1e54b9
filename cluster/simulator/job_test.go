package simulator

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// tinyTrace is a model small enough to follow by hand: on one GPU a step at
// local batch 8 takes 1 s; two GPUs on one node at local batch 4 take 0.6 s
// (0.1 s of it syncing). The gradient has no noise (var ≈ 0), so a batch
// larger than 8 gains nothing, and each epoch is 40 steps at batch 8.
func tinyTrace(t *testing.T) *Trace {
	t.Helper()
	placements := "placement,local_bsz,step_time,sync_time\n" +
		"1,4,0.5,0\n1,8,1.0,0\n1,16,2.0,0\n" +
		"2,4,0.6,0.1\n2,8,1.1,0.1\n2,16,2.1,0.1\n" +
		"11,4,0.8,0.3\n11,8,1.3,0.3\n11,16,2.3,0.3\n"
	scal := "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,4,2,1\n6,6,16,3,1\n6,24,4,3,2\n6,24,16,4,2\n"
	validation := "progress,iteration,metric,grad_sqr,grad_var\n40,40,0,1,0.000001\n80,80,0,1,0.000001\n120,120,0,1,0.000001\n"
	tr, err := ParseTrace("tiny", ModelConfig{MaxEpochs: 2}, traceFiles(placements, scal, map[int]string{8: validation, 32: validation}))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestJobFixedBatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		costs     rescaleModel
		nodes     []int
		completed float64
		attained  float64
	}{
		// 80 progress at 1 per second (gain 1, 1 s steps).
		{"one GPU, free start", rescaleModel{}, []int{0}, 80, 80},
		{"one GPU, 30 s start", rescaleModel{start: 30, rescale: 30}, []int{0}, 110, 110},
		// Two GPUs, local batch 4: 0.6 s per step of progress 1.
		{"two GPUs", rescaleModel{}, []int{3, 3}, 48, 96},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{spec: WorkloadJob{Name: "j"}, trace: tinyTrace(t), targetBatch: 8, restarts: -1}
			j.reallocate(tc.nodes, tc.costs)
			for now := 0.0; !j.done && now < 1000; now += 60 {
				if err := j.step(now, 60); err != nil {
					t.Fatal(err)
				}
			}
			if !j.done || j.completed != tc.completed || math.Abs(j.attained-tc.attained) > 1e-9 {
				t.Fatalf("done %v at %v s holding %v GPU·s; want %v s, %v GPU·s", j.done, j.completed, j.attained, tc.completed, tc.attained)
			}
			if j.restarts != 0 {
				t.Fatalf("restarts %d after one allocation", j.restarts)
			}
		})
	}
}

func TestJobRescalePhases(t *testing.T) {
	for _, tc := range []struct {
		name     string
		costs    rescaleModel
		next     []int
		progress float64 // after 10 s from the reallocation
		paused   float64
	}{
		// Checkpoint-restart: 2 s without progress, then 8 s on two GPUs
		// (1/0.6 per second).
		{"grow, one pause", rescaleModel{rescale: 2}, []int{0, 0}, 5 + 8/0.6, 2},
		// Live resize: 3 s more on the GPU it keeps while the joiner starts,
		// a 1 s pause, then 6 s on two GPUs.
		{"grow, joiner starts first", rescaleModel{rescale: 1, joinerStartup: 3}, []int{0, 0}, 5 + 3 + 6/0.6, 1},
		// Moving to another node keeps nothing: the start-up is a pause.
		{"move", rescaleModel{rescale: 1, joinerStartup: 3}, []int{5}, 5 + 6, 4},
		// No new GPU, no new worker: just the pause.
		{"no new GPU", rescaleModel{rescale: 1, joinerStartup: 3}, []int{0}, 5 + 9, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &job{spec: WorkloadJob{Name: "j"}, trace: tinyTrace(t), targetBatch: 8, restarts: -1}
			j.reallocate([]int{0}, rescaleModel{})
			if err := j.step(0, 5); err != nil {
				t.Fatal(err)
			}
			j.reallocate(tc.next, tc.costs)
			if err := j.step(5, 10); err != nil {
				t.Fatal(err)
			}
			if math.Abs(j.progress-tc.progress) > 1e-9 || math.Abs(j.rescaleSpent-tc.paused) > 1e-9 {
				t.Fatalf("progress %v after pausing %v s; want %v after %v s", j.progress, j.rescaleSpent, tc.progress, tc.paused)
			}
			if j.restarts != 1 {
				t.Fatalf("restarts %d, want 1", j.restarts)
			}
		})
	}
}

func TestKept(t *testing.T) {
	for _, tc := range []struct {
		old, next []int
		keep      []int
		grows     bool
	}{
		{nil, []int{0, 0}, nil, true},
		{[]int{0, 0}, []int{0, 0, 0, 1}, []int{2}, true},
		{[]int{0, 0, 1}, []int{1, 0}, []int{1, 1}, false},
		{[]int{2, 2}, []int{3, 3}, nil, true},
		{[]int{4, 4, 5}, []int{4, 5, 5}, []int{1, 1}, true},
	} {
		keep, grows := kept(tc.old, tc.next)
		if fmt.Sprint(keep) != fmt.Sprint(tc.keep) || grows != tc.grows {
			t.Errorf("kept(%v, %v) = %v, %v; want %v, %v", tc.old, tc.next, keep, grows, tc.keep, tc.grows)
		}
	}
}

func TestUpdateBatch(t *testing.T) {
	tr := tinyTrace(t)
	for _, tc := range []struct {
		batch     int
		placement []int
		atomic    int
		accum     int
	}{
		{8, []int{1}, 8, 0},
		{16, []int{1}, 8, 1},  // one replica above the initial batch: two micro-batches
		{32, []int{1}, 16, 1}, // 32 on one GPU of at most 16
		{8, []int{2}, 4, 0},
		{32, []int{1, 1}, 16, 0},
	} {
		j := &job{trace: tr, targetBatch: tc.batch}
		j.updateBatch(tc.placement)
		if j.atomic != tc.atomic || j.accum != tc.accum {
			t.Errorf("batch %d on %v: micro-batch %d + %d accumulated, want %d + %d", tc.batch, tc.placement, j.atomic, j.accum, tc.atomic, tc.accum)
		}
	}
}

// TestJobFractionalCosts: sub-second costs at a late hour of simulated time,
// where a float residue of a phase would be lost in the clock and never
// consumed (the simulation spun forever before the time was accounted
// exactly).
func TestJobFractionalCosts(t *testing.T) {
	j := &job{spec: WorkloadJob{Name: "j"}, trace: tinyTrace(t), targetBatch: 8, restarts: -1}
	costs := rescaleModel{start: 0.1, rescale: 0.1, joinerStartup: 0.3}
	done := make(chan error, 1)
	go func() {
		now := 12345.6
		j.reallocate([]int{0}, costs)
		for round := 0; !j.done && round < 100; round++ {
			if round == 1 {
				j.reallocate([]int{0, 0}, costs)
			}
			if err := j.step(now, 7.7); err != nil {
				done <- err
				return
			}
			now += 7.7
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("stepping the job did not return")
	}
	// 7.6 s of round 0 at 1 per second, then 0.3 s more on the kept GPU,
	// 0.1 s paused, and the rest on two GPUs at 1/0.6 per second.
	if !j.done || math.Abs(j.rescaleSpent-0.2) > 1e-9 {
		t.Fatalf("done %v, paused %v s; want done, 0.2 s", j.done, j.rescaleSpent)
	}
	want := 12345.6 + 7.6 + 0.3 + 0.1 + (80-7.9)*0.6
	if math.Abs(j.completed-want) > 1 {
		t.Fatalf("completed at %v, want about %v", j.completed, want)
	}
}
