package heuristics

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The utility-cost job: t_k = 1/k + 0.01·(k−1) s a step, so k·t_k =
// 1 + 0.01·k·(k−1). With a linear utility of v = 20 an hour and a price of
// P = 2 a worker-hour, for b remaining steps
//
//	U(k) − C(k) = −v·(elapsed + b·t_k)/3600 − t_k·b·k·P/3600
//	            = −v·elapsed/3600 − (b/3600)·f(k),  f(k) = t_k·(v + k·P),
//
// so the net utility is highest where f is lowest, whatever b and elapsed:
//
//	k    t_k        f(k) = t_k·(20 + 2k)
//	1    1          1·22          = 22
//	5    0.24       0.24·30       = 7.2
//	6    0.216667   0.216667·32   = 6.9333
//	7    0.202857   0.202857·34   = 6.8971   ← argmax of U − C
//	8    0.195      0.195·36      = 7.02
//	9    0.191111   0.191111·38   = 7.2622
//	12   0.193333   0.193333·44   = 8.5067
//
// and a step from old to new passes when ΔU − ΔC = (b/3600)·(f(old) − f(new))
// > 0, i.e. when f falls.
var utilityCurve = stepCurve(1, 0.01)

const linearParams = `{"price_per_worker_hour": 2, "value_per_hour": 20}`

func utilityHistory() *History {
	return &History{Start: simStart, Now: simStart.Add(time.Hour), TotalSteps: 10000}
}

func measuredAt(k int, stepTime func(int) time.Duration) Measurement {
	return Measurement{Workers: k, StepTime: stepTime(k), Steps: 20, Throughput: 64 / stepTime(k).Seconds()}
}

func TestUtilityCostPass(t *testing.T) {
	const stepParams = `{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "2h"}`
	for _, tc := range []struct {
		name     string
		params   string
		old, new int
		curve    func(int) time.Duration
		want     bool
		du, dc   float64
	}{
		// b = 10000, v·b/3600 = 55.556, P·b/3600 = 5.5556.
		// ΔU = 55.556·(t_6 − t_7) = 55.556·(1/42 − 0.01) = 55.556·0.0138095 = 0.76720
		// ΔC = 5.5556·(7·t_7 − 6·t_6) = 5.5556·(1.42 − 1.30) = 0.66667
		{"linear 6→7 passes", linearParams, 6, 7, utilityCurve, true, 0.76720, 0.66667},
		// ΔU = 55.556·(t_7 − t_8) = 55.556·(1/56 − 0.01) = 55.556·0.0078571 = 0.43651
		// ΔC = 5.5556·(1.56 − 1.42) = 0.77778
		{"linear 7→8 fails", linearParams, 7, 8, utilityCurve, false, 0.43651, 0.77778},
		// ΔU = 55.556·(1 − 0.24) = 42.222, ΔC = 5.5556·(1.2 − 1) = 1.1111
		{"linear 1→5 passes", linearParams, 1, 5, utilityCurve, true, 42.222, 1.1111},
		// ΔU = 55.556·(0.24 − 0.191111) = 2.7160, ΔC = 5.5556·(1.72 − 1.2) = 2.8889
		{"linear 5→9 fails", linearParams, 5, 9, utilityCurve, false, 2.7160, 2.8889},
		// Elapsed 1 h: T_2 = 3600 + 10000·0.51 = 8700 s > 7200 (U = 0),
		// T_4 = 3600 + 2800 = 6400 s ≤ 7200 (U = 100): ΔU = 100,
		// ΔC = 5.5556·(4·0.28 − 2·0.51) = 5.5556·0.10 = 0.55556.
		{"step 2→4 makes the deadline", stepParams, 2, 4, utilityCurve, true, 100, 0.55556},
		// T_8 = 3600 + 1950 = 5550 s: both in time, ΔU = 0,
		// ΔC = 5.5556·(1.56 − 1.12) = 2.4444.
		{"step 4→8 both in time", stepParams, 4, 8, utilityCurve, false, 0, 2.4444},
		// T_1 = 13600 s, T_2 = 8700 s: both late, ΔU = 0, ΔC = 5.5556·0.02 = 0.11111.
		{"step 1→2 both late", stepParams, 1, 2, utilityCurve, false, 0, 0.11111},
		// t = 0.5 s at 2, 0.25 s at 4 (perfect scaling): T_4 = 3600 + 2500 =
		// 6100 s, exactly the deadline, counts as in time. ΔU = 100, ΔC = 0.
		{"step on the deadline", `{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "1h41m40s"}`,
			2, 4, stepCurve(1, 0), true, 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heur, err := NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(tc.params)})
			if err != nil {
				t.Fatal(err)
			}
			ok, why, nums := heur.(*utilityCost).pass(measuredAt(tc.old, tc.curve), measuredAt(tc.new, tc.curve), utilityHistory())
			if ok != tc.want {
				t.Errorf("pass = %v (%s), want %v", ok, why, tc.want)
			}
			if math.Abs(nums["delta_utility"]-tc.du) > 1e-3 || math.Abs(nums["delta_cost"]-tc.dc) > 1e-3 {
				t.Errorf("ΔU = %.5f, ΔC = %.5f; want %.5f, %.5f (%s)", nums["delta_utility"], nums["delta_cost"], tc.du, tc.dc, why)
			}
			if nums["remaining_steps"] != 10000 {
				t.Errorf("remaining steps %v", nums["remaining_steps"])
			}
		})
	}
}

func TestUtilityCostRemaining(t *testing.T) {
	ctx := context.Background()
	h := simHistory(20, 64, []int{4}, utilityCurve)
	h.TotalSteps = 0
	heur, _ := NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(linearParams)})
	d, err := heur.Decide(ctx, h)
	if err != nil || d.Action != Hold || !strings.Contains(d.Reason, "total_steps") {
		t.Fatalf("unknown length: %v, %v; want a hold asking for total_steps", d, err)
	}

	// total_steps overrides the trainer's count.
	heur, _ = NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(`{"price_per_worker_hour": 2, "value_per_hour": 20, "total_steps": 10022}`)})
	d, _ = heur.Decide(ctx, h)
	if d.Action != Grow || d.Count != 4 {
		t.Fatalf("with total_steps: %v; want the search's first grow", d)
	}
	// b = 10022 − 22 steps run = 10000.
	h2 := simHistory(20, 64, []int{4, 8}, utilityCurve)
	h2.TotalSteps = 123
	d, _ = heur.Decide(ctx, h2)
	if d.Numbers["remaining_steps"] != 10022-44 {
		t.Fatalf("remaining steps %v, want %d (from total_steps, not the trainer's 123)", d.Numbers["remaining_steps"], 10022-44)
	}

	// Nothing left: hold.
	h.TotalSteps = h.Step
	heur, _ = NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(linearParams)})
	if d, _ := heur.Decide(ctx, h); d.Action != Hold || !strings.Contains(d.Reason, "done") {
		t.Fatalf("finished job: %v", d)
	}
}

func TestUtilityCostSearch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		start     int
		params    string
		wantSizes []int
	}{
		// 1→5 passes (f 22 → 7.2), 5→9 fails (7.2 → 7.26); shrinking:
		// at 8, 8→9 fails; at 7, 7→8 fails (6.90 → 7.02); at 6, 6→7
		// passes (6.93 → 6.90): grow to 7, settled.
		{"from 1", 1, linearParams, []int{1, 5, 9, 8, 7, 6, 7}},
		// 8→12 fails (7.02 → 8.51), then down to 6 as above.
		{"from 8", 8, linearParams, []int{8, 12, 11, 10, 9, 8, 7, 6, 7}},
		// grow_by 2: 1→3→5→7 pass (f 22, 9.19, 7.2, 6.90), 7→9 fails; at 9,
		// 8 is unknown; at 8, 8→9 fails, 7→8 fails; at 7, 7→8 fails and
		// 6 is unknown; at 6, 6→7 passes.
		{"grow by 2", 1, `{"price_per_worker_hour": 2, "value_per_hour": 20, "grow_by": 2}`, []int{1, 3, 5, 7, 9, 8, 7, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heur, err := NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(tc.params)})
			if err != nil {
				t.Fatal(err)
			}
			j := newSimJob(tc.start, 0, 0, utilityCurve)
			j.h.TotalSteps = 1_000_000
			d := j.untilSettled(t, heur, nil)
			t.Log(j.trace())
			if !slices.Equal(j.sizes, tc.wantSizes) || j.h.Workers() != 7 || len(j.decisions) != len(tc.wantSizes) {
				t.Fatalf("sizes %v after %d decisions, want %v settling at 7; last %v%s", j.sizes, len(j.decisions), tc.wantSizes, d, j.trace())
			}
		})
	}
}

func TestUtilityCostRegistry(t *testing.T) {
	r := NewRegistry()
	for _, tc := range []struct {
		params string
		errs   string // "" when valid
	}{
		{linearParams, ""},
		{`{"price_per_worker_hour": 2.5, "utility": "linear", "value_per_hour": 40, "total_steps": 5000, "grow_by": 2}`, ""},
		{`{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "2h"}`, ""},
		{``, "price_per_worker_hour"},
		{`{"value_per_hour": 20}`, "price_per_worker_hour"},
		{`{"price_per_worker_hour": -1, "value_per_hour": 20}`, "price_per_worker_hour"},
		{`{"price_per_worker_hour": 2}`, "value_per_hour"},
		{`{"price_per_worker_hour": 2, "utility": "quadratic", "value_per_hour": 20}`, "linear"},
		{`{"price_per_worker_hour": 2, "utility": "step", "value": 100}`, "deadline"},
		{`{"price_per_worker_hour": 2, "utility": "step", "deadline": "2h"}`, "value"},
		{`{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "2 hours"}`, "2 hours"},
		{`{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "2h", "value_per_hour": 5}`, "value_per_hour"},
		{`{"price_per_worker_hour": 2, "value_per_hour": 20, "deadline": "2h"}`, "step utility"},
		{`{"price_per_worker_hour": 2, "value_per_hour": 20, "total_steps": -5}`, "total_steps"},
		{`{"price_per_worker_hour": 2, "value_per_hour": 20, "price": 3}`, "unknown field"},
	} {
		h, err := r.New(Spec{Name: "utility-cost", Params: []byte(tc.params)})
		if tc.errs == "" {
			if err != nil || h.Name() != "utility-cost" {
				t.Errorf("%s: %v, %v", tc.params, h, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.errs) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.params, err, tc.errs)
		}
	}
	s, err := SpecFromOptions("utility-cost", []string{"price_per_worker_hour=2.5", "utility=step", "value=40", "deadline=90m"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := h.(*utilityCost).cfg; cfg.Utility != "step" || cfg.Value != 40 || time.Duration(cfg.Deadline) != 90*time.Minute || cfg.GrowBy != 4 {
		t.Errorf("configuration %+v", cfg)
	}
}

// A trainer that keeps the per-worker batch: the global batch grows with the
// world, so the remaining steps, counted in the current world's batch, take
// fewer, larger steps in a larger world. One worker runs 32 samples in
// 0.1 s (320/s), two run 64 in 0.12 s (533.3/s); 1000 steps of 32 remain:
//
//	k=1: 32000/320   = 100 s, C = 100·1·2/3600 = 0.055556, U = −20·(3600+100)/3600
//	k=2: 32000/533.3 =  60 s, C =  60·2·2/3600 = 0.066667, U = −20·(3600+60)/3600
//	ΔU = 20·40/3600 = 0.22222 > ΔC = 0.011111: grow.
//
// Counting 1000 steps of 0.12 s at two workers (120 s, the fixed-global-batch
// reading) would make growing look slower and fail.
func TestUtilityCostPerWorkerBatch(t *testing.T) {
	h := utilityHistory()
	cur := &Period{Epoch: 1, Members: []string{"w0"}, Start: h.Start}
	for i := range 10 {
		cur.Steps = append(cur.Steps, StepStats{Step: int64(i + 1), GlobalBatch: 32, Time: 100 * time.Millisecond})
	}
	h.Periods, h.Step = []*Period{cur}, 10
	h.TotalSteps = h.Step + 1000
	heur, err := NewRegistry().New(Spec{Name: "utility-cost", Params: []byte(linearParams)})
	if err != nil {
		t.Fatal(err)
	}
	old := Measurement{Workers: 1, Steps: 20, GlobalBatch: 32, StepTime: 100 * time.Millisecond, Throughput: 320}
	new := Measurement{Workers: 2, Steps: 20, GlobalBatch: 64, StepTime: 120 * time.Millisecond, Throughput: 64 / 0.12}
	ok, why, nums := heur.(*utilityCost).pass(old, new, h)
	if !ok || math.Abs(nums["delta_utility"]-0.22222) > 1e-4 || math.Abs(nums["delta_cost"]-0.011111) > 1e-5 ||
		nums["completion_old"] != 3700 || math.Abs(nums["completion_new"]-3660) > 1e-9 || nums["global_batch"] != 32 {
		t.Fatalf("pass = %v, numbers %v (%s); want ΔU 0.22222 > ΔC 0.011111, finishing at 3700 and 3660 s", ok, nums, why)
	}
}
