package steer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/heuristics/goodput"
)

// history is a job measured in worlds of the given sizes, 20 steps each at
// 64 samples and a step time that scales as 100 ms / size.
func history(sizes ...int) *heuristics.History {
	h := &heuristics.History{MinWorkers: 1}
	for e, k := range sizes {
		p := &heuristics.Period{Epoch: uint64(e + 1)}
		for i := range k {
			p.Members = append(p.Members, fmt.Sprintf("w%d", i))
		}
		for i := range 20 {
			p.Steps = append(p.Steps, heuristics.StepStats{Step: int64(i + 1), GlobalBatch: 64, Time: 100 * time.Millisecond / time.Duration(k)})
		}
		h.Periods = append(h.Periods, p)
	}
	return h
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name     string
		growOnly bool
		target   int
		world    []int
		want     heuristics.Action
		count    int
	}{
		{"no world", false, 3, nil, heuristics.Hold, 0},
		{"no target", false, 0, []int{2}, heuristics.Hold, 0},
		{"grow", false, 4, []int{2}, heuristics.Grow, 2},
		{"shrink", false, 1, []int{3}, heuristics.Shrink, 2},
		{"at target", false, 3, []int{3}, heuristics.Hold, 0},
		{"grow only grows", true, 4, []int{2}, heuristics.Grow, 2},
		{"grow only never shrinks", true, 1, []int{3}, heuristics.Hold, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Config{Target: tc.target, GrowOnly: tc.growOnly, Allocator: "the test"})
			d, err := s.Decide(context.Background(), history(tc.world...))
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tc.want || d.Count != tc.count {
				t.Fatalf("got %v, want %v by %d", d, tc.want, tc.count)
			}
			if err := d.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSetTargetWakesTheEngine(t *testing.T) {
	s := New(Config{Target: 2})
	woken := 0
	s.OnReady(func() { woken++ })
	s.SetTarget(2)
	s.SetTarget(3)
	s.SetTarget(3)
	if woken != 1 || s.Target() != 3 {
		t.Fatalf("woken %d times, target %d; want once, 3", woken, s.Target())
	}
	d, _ := s.Decide(context.Background(), history(2))
	if d.Action != heuristics.Grow || d.Count != 1 {
		t.Fatalf("after SetTarget(3) at 2 workers: %v", d)
	}
}

func TestFitsTheModel(t *testing.T) {
	s := New(Config{FitEvery: time.Nanosecond})
	if f := s.Model(); f.OK || f.Why == "" {
		t.Fatalf("before any step: %+v", f)
	}
	h := history(1, 2, 4)
	if _, err := s.Decide(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	f := s.Model()
	if !f.OK || f.MaxProfiled != 4 {
		t.Fatalf("after worlds of 1, 2 and 4: %+v", f)
	}
	// Unmeasured worlds leave it unfitted, with the reason.
	s = New(Config{FitEvery: time.Nanosecond})
	if _, err := s.Decide(context.Background(), &heuristics.History{}); err != nil {
		t.Fatal(err)
	}
	if f := s.Model(); f.OK || f.Why != "measuring" {
		t.Fatalf("no steps: %+v", f)
	}
}

// A Steer given what the job's earlier driver recorded fits to it before it
// has measured a step (the allocator sees the job as it was, not as new), and
// counts its own steps with it.
func TestTakesTheRecordedProfile(t *testing.T) {
	earlier := New(Config{FitEvery: time.Nanosecond})
	if _, err := earlier.Decide(context.Background(), history(1, 2, 4)); err != nil {
		t.Fatal(err)
	}
	was := earlier.Model()
	if !was.OK || len(was.Profile) != 3 {
		t.Fatalf("the earlier driver's model: %+v", was)
	}
	prof := &goodput.Profile{}
	for _, e := range was.Profile {
		if err := prof.AddEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		since   []int
		entries int
	}{
		{"nothing measured since", nil, 3},
		{"a world of 4 measured since", []int{4}, 3},
		{"a world of 3 measured since", []int{3}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Config{FitEvery: time.Nanosecond, Recorded: &Recorded{Model: was.Model, Profile: prof}})
			if _, err := s.Decide(context.Background(), history(tc.since...)); err != nil {
				t.Fatal(err)
			}
			f := s.Model()
			if !f.OK || f.MaxProfiled != 4 || len(f.Profile) != tc.entries || f.Model.InitBatch != was.Model.InitBatch {
				t.Fatalf("taking over %+v: %+v; want fitted, 4 profiled, %d configurations", was, f, tc.entries)
			}
			if tc.since == nil && f.Model.Perf != was.Model.Perf {
				t.Errorf("fitted to the record alone: %+v, the earlier driver's %+v", f.Model.Perf, was.Model.Perf)
			}
		})
	}
	if len(prof.Entries()) != 3 {
		t.Errorf("the recorded profile changed: %+v", prof.Entries())
	}
}
