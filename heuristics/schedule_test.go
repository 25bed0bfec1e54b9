package heuristics

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestScheduleParsing(t *testing.T) {
	want := schedule{{Step: 0, Workers: 2}, {Step: 50, Workers: 4}}
	for _, tc := range []struct {
		name, params string
	}{
		{"list", `{"schedule": [{"step": 0, "workers": 2}, {"step": 50, "workers": 4}]}`},
		{"string", `{"schedule": "0:2,50:4"}`},
		{"string with spaces", `{"schedule": " 0 : 2 , 50:4 "}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewRegistry().New(Spec{Name: "fixed-schedule", Params: []byte(tc.params)})
			if err != nil {
				t.Fatal(err)
			}
			if got := h.(*fixedSchedule).entries; !slices.Equal(got, want) {
				t.Fatalf("schedule %v, want %v", got, want)
			}
			if h.Name() != "fixed-schedule" {
				t.Fatalf("name %q", h.Name())
			}
		})
	}
	// The command line's form: not JSON, so it arrives as a string.
	s, err := SpecFromOptions("fixed-schedule", []string{"schedule=0:2,50:4"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewRegistry().New(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.(*fixedSchedule).entries; !slices.Equal(got, want) {
		t.Fatalf("from options: %v, want %v", got, want)
	}
	s, _ = SpecFromOptions("fixed-schedule", []string{`schedule=[{"step":0,"workers":2},{"step":50,"workers":4}]`})
	if h, err = NewRegistry().New(s); err != nil || !slices.Equal(h.(*fixedSchedule).entries, want) {
		t.Fatalf("JSON list from options: %v, %v", h, err)
	}
}

func TestScheduleErrors(t *testing.T) {
	for _, tc := range []struct {
		params, errs string
	}{
		{``, "needs a schedule"},
		{`{"schedule": []}`, "needs a schedule"},
		{`{"schedule": ""}`, "not step:workers"},
		{`{"schedule": "50:4,0:2"}`, "not sorted"},
		{`{"schedule": [{"step": 50, "workers": 4}, {"step": 0, "workers": 2}]}`, "not sorted"},
		{`{"schedule": "0:2,0:4"}`, "step 0 twice"},
		{`{"schedule": "0:0"}`, "workers must be ≥ 1"},
		{`{"schedule": [{"step": 0, "workers": -1}]}`, "workers must be ≥ 1"},
		{`{"schedule": "-5:2"}`, "step must be ≥ 0"},
		{`{"schedule": "garbage"}`, "not step:workers"},
		{`{"schedule": "0:two"}`, "workers is not an integer"},
		{`{"schedule": "x:2"}`, "step is not an integer"},
		{`{"schedule": "0:2,"}`, "not step:workers"},
		{`{"schedule": 4}`, "schedule must be a list"},
		{`{"schedule": [{"step": 0, "workers": 2, "when": 1}]}`, "unknown field"},
		{`{"schedule": "0:2", "extra": 1}`, "unknown field"},
	} {
		_, err := NewRegistry().New(Spec{Name: "fixed-schedule", Params: []byte(tc.params)})
		if err == nil || !strings.Contains(err.Error(), tc.errs) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.params, err, tc.errs)
		}
	}
}

func TestScheduleDecisions(t *testing.T) {
	heur, err := NewRegistry().New(Spec{Name: "fixed-schedule", Params: []byte(`{"schedule": "10:2,50:6,100:3"}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		step       int64
		workers    int
		minW, maxW int
		action     Action
		count      int
		settled    bool
	}{
		{0, 1, 0, 0, Hold, 0, false},  // before the first entry
		{10, 1, 0, 0, Grow, 1, false}, // 10:2
		{30, 2, 0, 0, Hold, 0, false}, // on target, more entries to come
		{30, 4, 0, 0, Shrink, 2, false},
		{50, 2, 0, 0, Grow, 4, false},    // 50:6
		{60, 2, 0, 4, Grow, 2, false},    // 6 clamped to the maximum 4
		{60, 4, 0, 4, Hold, 0, false},    // at the clamped target
		{100, 6, 0, 0, Shrink, 3, false}, // 100:3, the last entry, not reached yet
		{500, 3, 0, 0, Hold, 0, true},    // the last entry, reached
		{500, 2, 0, 0, Grow, 1, false},
		{500, 4, 4, 0, Hold, 0, true}, // 3 clamped to the minimum 4
		{30, 0, 0, 0, Hold, 0, false}, // no world
	} {
		h := &History{Step: tc.step, MinWorkers: tc.minW, MaxWorkers: tc.maxW}
		if tc.workers > 0 {
			h.Periods = []*Period{simPeriod(1, tc.workers, 1, 100e6, 64, simStart, 0)}
		}
		d, err := heur.Decide(context.Background(), h)
		if err != nil {
			t.Fatal(err)
		}
		wantSettled := tc.settled && tc.action == Hold
		if d.Action != tc.action || d.Count != tc.count || d.Settled != wantSettled || d.Validate() != nil {
			t.Errorf("step %d at %d workers (bounds %d..%d): %v (settled %v), want %v by %d (settled %v)",
				tc.step, tc.workers, tc.minW, tc.maxW, d, d.Settled, tc.action, tc.count, wantSettled)
		}
	}
}

// fakeHeuristic answers with a fixed decision and counts its calls.
type fakeHeuristic struct {
	name  string
	d     Decision
	calls int
}

func (f *fakeHeuristic) Name() string { return f.name }
func (f *fakeHeuristic) Decide(context.Context, *History) (Decision, error) {
	f.calls++
	return f.d, nil
}

func TestCompositionWithSchedules(t *testing.T) {
	r := NewRegistry()
	h := &History{Step: 60, Periods: []*Period{simPeriod(1, 2, 1, 100e6, 64, simStart, 0)}}
	for _, tc := range []struct {
		name   string
		spec   string
		action Action
		count  int
	}{
		// Both grow, by 2 and 4: all-of takes the smaller change.
		{"all-of agree", `{"name": "all-of", "of": [
			{"name": "fixed-schedule", "params": {"schedule": "0:4"}},
			{"name": "fixed-schedule", "params": {"schedule": "0:1,50:6"}}]}`, Grow, 2},
		// One grows, one holds: all-of holds.
		{"all-of disagree", `{"name": "all-of", "of": [
			{"name": "fixed-schedule", "params": {"schedule": "0:4"}},
			{"name": "fixed-schedule", "params": {"schedule": "0:2"}}]}`, Hold, 0},
		// any-of acts on the first member that does not hold.
		{"any-of", `{"name": "any-of", "of": [
			{"name": "fixed-schedule", "params": {"schedule": "0:2"}},
			{"name": "fixed-schedule", "params": {"schedule": "0:1"}},
			{"name": "fixed-schedule", "params": {"schedule": "0:5"}}]}`, Shrink, 1},
		{"any-of all hold", `{"name": "any-of", "of": [
			{"name": "fixed-schedule", "params": {"schedule": "0:2"}},
			{"name": "hold"}]}`, Hold, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec([]byte(tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			heur, err := r.New(s)
			if err != nil {
				t.Fatal(err)
			}
			d, err := heur.Decide(context.Background(), h)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tc.action || d.Count != tc.count || !strings.Contains(d.Reason, "fixed-schedule: ") {
				t.Fatalf("%v, want %v by %d", d, tc.action, tc.count)
			}
		})
	}

	// Every member is asked, so each keeps observing; settled only when all are.
	a := &fakeHeuristic{name: "a", d: Decision{Action: Hold, Reason: "a holds", Settled: true}}
	b := &fakeHeuristic{name: "b", d: Decision{Action: Grow, Count: 3, Reason: "b grows", Numbers: map[string]float64{"x": 1}}}
	r = NewRegistry()
	for _, f := range []*fakeHeuristic{a, b} {
		if err := r.Register(f.name, "test", func(*Registry, Spec) (Heuristic, error) { return f, nil }); err != nil {
			t.Fatal(err)
		}
	}
	anyOf, _ := r.New(Spec{Name: "any-of", Of: []Spec{{Name: "a"}, {Name: "b"}}})
	d, _ := anyOf.Decide(context.Background(), h)
	if d.Action != Grow || d.Count != 3 || d.Numbers["b.x"] != 1 || a.calls != 1 || b.calls != 1 {
		t.Fatalf("any-of: %v %v (calls %d, %d)", d, d.Numbers, a.calls, b.calls)
	}
	allOf, _ := r.New(Spec{Name: "all-of", Of: []Spec{{Name: "a"}, {Name: "b"}}})
	if d, _ := allOf.Decide(context.Background(), h); d.Action != Hold || d.Settled || !strings.Contains(d.Reason, "members disagree") {
		t.Fatalf("all-of: %v", d)
	}
	b.d = Decision{Action: Hold, Reason: "b holds", Settled: true}
	if d, _ := allOf.Decide(context.Background(), h); d.Action != Hold || !d.Settled {
		t.Fatalf("all-of, both settled: %v", d)
	}
	if allOf.Name() != "all-of(a, b)" {
		t.Fatalf("name %q", allOf.Name())
	}
}
