package heuristics

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestScalingEfficiencyPass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold float64
		old, new  Measurement
		want      bool
		eff       float64
	}{
		// ((2210−1520)/4) / (1520/4) = 172.5/380 = 0.45395
		{"good scaling", 0.1, Measurement{Workers: 4, Throughput: 1520}, Measurement{Workers: 8, Throughput: 2210}, true, 0.45395},
		// ((440−400)/4) / (400/4) = 10/100 = 0.1, not > 0.1
		{"at the threshold", 0.1, Measurement{Workers: 4, Throughput: 400}, Measurement{Workers: 8, Throughput: 440}, false, 0.1},
		// ((441−400)/4) / 100 = 10.25/100 = 0.1025
		{"just above", 0.1, Measurement{Workers: 4, Throughput: 400}, Measurement{Workers: 8, Throughput: 441}, true, 0.1025},
		// ((180−200)/1) / (200/2) = −20/100 = −0.2
		{"slower", 0, Measurement{Workers: 2, Throughput: 200}, Measurement{Workers: 3, Throughput: 180}, false, -0.2},
		// ((250−100)/1) / (100/1) = 1.5: superlinear
		{"superlinear", 1, Measurement{Workers: 1, Throughput: 100}, Measurement{Workers: 2, Throughput: 250}, true, 1.5},
		// ((230−210)/2) / (210/4) = 10/52.5 = 0.190476
		{"high threshold", 0.5, Measurement{Workers: 4, Throughput: 210}, Measurement{Workers: 6, Throughput: 230}, false, 0.190476},
		{"nothing measured", 0.1, Measurement{Workers: 4}, Measurement{Workers: 8, Throughput: 100}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heur, err := newScalingEfficiency(nil, Spec{Name: "scaling-efficiency", Params: []byte(`{"threshold": ` + strconv.FormatFloat(tc.threshold, 'g', -1, 64) + `}`)})
			if err != nil {
				t.Fatal(err)
			}
			ok, why, nums := heur.(*scalingEfficiency).pass(tc.old, tc.new, &History{})
			if ok != tc.want {
				t.Errorf("pass = %v (%s), want %v", ok, why, tc.want)
			}
			if math.Abs(nums["efficiency"]-tc.eff) > 1e-5 {
				t.Errorf("efficiency = %v, want %v", nums["efficiency"], tc.eff)
			}
			if nums["threshold"] != tc.threshold || nums["throughput_old"] != tc.old.Throughput || nums["throughput_new"] != tc.new.Throughput {
				t.Errorf("numbers %v", nums)
			}
		})
	}
}

// The job of the simulated searches below: 64 samples a step taking
// t_k = 1/k + 0.02·(k−1) s, so R_k = 64/t_k samples/s:
//
//	k    t_k       R_k      s(k−1→k) = (k−1)·(t_{k−1}/t_k − 1)
//	1    1         64
//	4    0.31      206.45
//	5    0.28      228.57   4·(0.31/0.28 − 1)      = 0.4286
//	6    0.266667  240.00   5·(0.28/0.266667 − 1)  = 0.25
//	7    0.262857  243.48   6·(0.266667/0.262857 − 1) = 0.0870
//	8    0.265     241.51   7·(0.262857/0.265 − 1)  = −0.0566
//	9    0.271111  236.07
//
// With threshold 0.1, k* = max{k : s(k−1→k) > 0.1} = 6. The growing steps
// judge 4 workers at a time: s(1→5) = ((228.57−64)/4)/64 = 0.643 passes,
// s(5→9) = ((236.07−228.57)/4)/(228.57/5) = 1.874/45.71 = 0.041 fails, and
// s(5→8) = ((241.51−228.57)/3)/45.71 = 4.313/45.71 = 0.0943 fails.
var efficiencyCurve = stepCurve(1, 0.02)

func TestScalingEfficiencySearch(t *testing.T) {
	for _, tc := range []struct {
		name          string
		start         int
		minW, maxW    int
		wantSizes     []int
		wantSettled   int
		wantDecisions int
	}{
		// 1→5 passes (0.643), 5→9 fails (0.041): shrink 9, 8, 7 measuring
		// each below; at 6, 6→7 fails (0.087) and 5→6 passes (0.25): settle.
		{"from 1", 1, 0, 0, []int{1, 5, 9, 8, 7, 6}, 6, 6},
		// 12→16 fails (R falls); shrinking down to 5 where 5→6 passes: the
		// decision growing back to 6 settles, and 6 then holds.
		{"from 12", 12, 0, 0, []int{12, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 6}, 6, 14},
		// 5→8 (clamped) fails at 0.0943; 8, 7, 6 as above.
		{"max 8", 1, 0, 8, []int{1, 5, 8, 7, 6}, 6, 5},
		// 5→6 passes at the maximum: settled there at once.
		{"max 6", 1, 0, 6, []int{1, 5, 6}, 6, 3},
		// 8→12 fails; shrinking to 8, where 8→9 fails and 7 is below the
		// minimum.
		{"min 8", 8, 8, 0, []int{8, 12, 11, 10, 9, 8}, 8, 6},
		// Starting at the maximum: 3→4 passes (0.6129), so 4 it is.
		{"start at max 4", 4, 0, 4, []int{4, 3, 4}, 4, 3},
		{"min = max", 5, 5, 5, []int{5}, 5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heur, err := NewRegistry().New(Spec{Name: "scaling-efficiency"})
			if err != nil {
				t.Fatal(err)
			}
			j := newSimJob(tc.start, tc.minW, tc.maxW, efficiencyCurve)
			d := j.untilSettled(t, heur, nil)
			if got := j.h.Workers(); got != tc.wantSettled || !slices.Equal(j.sizes, tc.wantSizes) || len(j.decisions) != tc.wantDecisions {
				t.Fatalf("settled at %d after %d decisions through %v, want %d after %d through %v; last %v%s",
					got, len(j.decisions), j.sizes, tc.wantSettled, tc.wantDecisions, tc.wantSizes, d, j.trace())
			}
			// Settled stays settled.
			j.runSteps(50)
			if d, _ := heur.Decide(context.Background(), j.h); d.Action != Hold || !d.Settled {
				t.Fatalf("after settling: %v", d)
			}
		})
	}
}

func TestScalingEfficiencyReasons(t *testing.T) {
	heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
	j := newSimJob(1, 0, 0, efficiencyCurve)
	j.untilSettled(t, heur, nil)
	t.Log(j.trace())
	first, second := j.decisions[0], j.decisions[1]
	if first.Action != Grow || first.Count != 4 || !strings.Contains(first.Reason, "1 worker: 64.0 samples/s; the first size measured; growing by 4 to compare") {
		t.Errorf("first decision: %v", first)
	}
	if second.Action != Grow || second.Count != 4 ||
		!strings.Contains(second.Reason, "1→5 workers: throughput 64.0→228.6 samples/s, scaling efficiency 0.643 > threshold 0.100; growing by 4") {
		t.Errorf("second decision: %v", second)
	}
	for _, key := range []string{"workers_old", "workers_new", "throughput_old", "throughput_new", "efficiency", "threshold"} {
		if _, ok := second.Numbers[key]; !ok {
			t.Errorf("second decision's numbers lack %s: %v", key, second.Numbers)
		}
	}
	third := j.decisions[2]
	if third.Action != Shrink || !strings.Contains(third.Reason, "5→9 workers") || !strings.Contains(third.Reason, "0.041 ≤ threshold") {
		t.Errorf("third decision: %v", third)
	}
	last := j.decisions[len(j.decisions)-1]
	if !strings.Contains(last.Reason, "6→7 workers") || !strings.Contains(last.Reason, "0.087 ≤ threshold") || !strings.Contains(last.Reason, "5→6 workers") ||
		!strings.Contains(last.Reason, "0.250 > threshold") || !strings.Contains(last.Reason, "settled at 6") || last.Numbers["above_efficiency"] == 0 {
		t.Errorf("last decision: %v", last)
	}
}

// Workers lost and added around the search, as the engine reports them.
func TestScalingEfficiencyFailures(t *testing.T) {
	t.Run("failure after settling is restored", func(t *testing.T) {
		heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
		j := newSimJob(1, 0, 0, efficiencyCurve)
		j.untilSettled(t, heur, nil)
		j.newWorld(5) // a worker of the 6 failed
		n := len(j.decisions)
		j.untilSettled(t, heur, nil)
		got := j.decisions[n:]
		if len(got) != 2 || got[0].Action != Grow || got[0].Count != 1 || !strings.Contains(got[0].Reason, "restoring the settled size") ||
			got[1].Action != Hold || j.h.Workers() != 6 {
			t.Fatalf("after the failure: %s", j.trace())
		}
	})
	t.Run("workers added after settling are kept", func(t *testing.T) {
		heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
		j := newSimJob(1, 0, 0, efficiencyCurve)
		j.untilSettled(t, heur, nil)
		j.newWorld(9)
		d := j.untilSettled(t, heur, nil)
		if j.h.Workers() != 9 || !strings.Contains(d.Reason, "above the settled 6") {
			t.Fatalf("after adding: %v", d)
		}
	})
	t.Run("lost while growing", func(t *testing.T) {
		// Asked to grow 6→10, the world comes back with 5. 5→6 passes
		// (0.25): grow back to 6, then 6→10 fails (R_10 = 228.57 < 240),
		// shrinking 10, 9, 8, 7; at 6, 6→7 fails and 5→6 passes.
		heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
		j := newSimJob(6, 0, 0, efficiencyCurve)
		j.untilSettled(t, heur, func(i, k int, d Decision) int {
			if i == 0 {
				return 5
			}
			return j.h.Clamp(k + actionSign(d)*d.Count)
		})
		if want := []int{6, 5, 6, 10, 9, 8, 7, 6}; !slices.Equal(j.sizes, want) || j.h.Workers() != 6 {
			t.Fatalf("sizes %v, want %v%s", j.sizes, want, j.trace())
		}
		if !strings.Contains(j.decisions[1].Reason, "growing back by 1") {
			t.Errorf("second decision: %v", j.decisions[1])
		}
	})
	t.Run("lost while shrinking", func(t *testing.T) {
		// 1, 5, 9, 8 as from 1; asked to shrink 8→7 the world comes back
		// with 6, so 7 was never compared: back to 8 (the smallest measured
		// size above), then 7; at 7, 7→8 and 6→7 fail; at 6, 5→6 passes.
		heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
		j := newSimJob(1, 0, 0, efficiencyCurve)
		j.untilSettled(t, heur, func(i, k int, d Decision) int {
			if i == 3 {
				return 6
			}
			return j.h.Clamp(k + actionSign(d)*d.Count)
		})
		if want := []int{1, 5, 9, 8, 6, 8, 7, 6}; !slices.Equal(j.sizes, want) || j.h.Workers() != 6 {
			t.Fatalf("sizes %v, want %v%s", j.sizes, want, j.trace())
		}
	})
	t.Run("grow not carried out", func(t *testing.T) {
		// The engine could not add workers at 5: the world stays, and the
		// search asks again at the next evaluation.
		heur, _ := NewRegistry().New(Spec{Name: "scaling-efficiency"})
		j := newSimJob(1, 0, 0, efficiencyCurve)
		j.untilSettled(t, heur, func(i, k int, d Decision) int {
			if i == 1 {
				return k
			}
			return j.h.Clamp(k + actionSign(d)*d.Count)
		})
		if want := []int{1, 5, 9, 8, 7, 6}; !slices.Equal(j.sizes, want) || j.decisions[2].Action != Grow {
			t.Fatalf("sizes %v, want %v%s", j.sizes, want, j.trace())
		}
	})
}

func actionSign(d Decision) int {
	switch d.Action {
	case Grow:
		return 1
	case Shrink:
		return -1
	}
	return 0
}

func TestScalingEfficiencyRegistry(t *testing.T) {
	r := NewRegistry()
	for _, tc := range []struct {
		params string
		errs   string // "" when valid
	}{
		{``, ""},
		{`{}`, ""},
		{`{"threshold": 0.2, "grow_by": 2, "min_steps": 5, "eval_every": 1}`, ""},
		{`{"threshold": 0}`, ""},
		{`{"threshold": -0.1}`, "threshold"},
		{`{"treshold": 0.1}`, "unknown field"},
		{`{"threshold": "high"}`, "threshold"},
		{`{"grow_by": 0}`, "grow_by"},
	} {
		h, err := r.New(Spec{Name: "scaling-efficiency", Params: []byte(tc.params)})
		if tc.errs == "" {
			if err != nil || h.Name() != "scaling-efficiency" {
				t.Errorf("%s: %v, %v", tc.params, h, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.errs) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.params, err, tc.errs)
		}
	}
	// Options from the command line reach the configuration.
	s, err := SpecFromOptions("scaling-efficiency", []string{"threshold=0.25", "grow_by=2"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.New(s)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := h.(*scalingEfficiency).cfg; cfg.Threshold != 0.25 || cfg.GrowBy != 2 || cfg.MinSteps != 20 || cfg.EvalEvery != 10 {
		t.Errorf("configuration %+v", cfg)
	}
}
