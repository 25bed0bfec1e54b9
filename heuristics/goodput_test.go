package heuristics

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/heuristics/goodput"
)

// measured is a world of k workers, measured over steady steps of the given
// global batch, step time and per-member compute time, reporting gradient
// statistics (sqr, v; v = 0: none).
type measured struct {
	k, batch, accum int
	step, compute   time.Duration
	sqr, v          float64
}

// goodputHistory is a job that ran the worlds in order, 30 steady steps each.
func goodputHistory(ws ...measured) *History {
	h := &History{Start: simStart, Now: simStart.Add(time.Hour)}
	for i, w := range ws {
		p := &Period{Epoch: uint64(i + 1), Start: simStart.Add(time.Duration(i) * time.Minute)}
		for j := range w.k {
			p.Members = append(p.Members, fmt.Sprintf("w%d", j))
		}
		for range 30 {
			h.Step++
			st := StepStats{Step: h.Step, GlobalBatch: w.batch, Time: w.step, Accum: w.accum, GradSqr: w.sqr, GradVar: w.v,
				Compute: map[string]time.Duration{}, Samples: map[string]int{}}
			for _, m := range p.Members {
				st.Compute[m], st.Samples[m] = w.compute, w.batch/w.k
			}
			p.Steps = append(p.Steps, st)
		}
		h.Periods = append(h.Periods, p)
	}
	return h
}

// The goodput job. M0 = 64, the batch is only split (max_batch = M0), every
// worker on its own machine, and the gradient all noise (sqr = 0), so the
// statistical efficiency is 1 at every batch: goodput is throughput.
//
// One worker: a step of 0.1 s, all compute. Two: micro-batch 32, compute
// 0.075 s, step 0.08 s (a sync of 0.005 s across machines). The fit is exact:
// T_acc(m) = 0.05 + 0.05·m/64 (α_c = 0.05, β_c = 0.05/64), T_net = 0.005 at
// every size beyond one (β_n pinned: no more than two replicas seen), γ = 1
// (the regularizer's choice when nothing tells the overlap). Predicted, for M
// = k·⌈64/k⌉:
//
//	k   m    T_acc       T_iter      goodput = M/T_iter   added per worker
//	1   64   0.1         0.1         640
//	2   32   0.075       0.08        800                  (800−640)/640       = 0.250
//	3   22   0.0671875   0.0721875   66/0.0721875 = 914.29 (914.29−800)/400  = 0.286
//	4   16   0.0625      0.0675      948.15               (948.15−914.29)/304.76 = 0.111
//
// and 4 is the most it may predict for: twice the largest size measured.
var (
	oneWorker  = measured{k: 1, batch: 64, step: 100 * time.Millisecond, compute: 100 * time.Millisecond, v: 1}
	twoWorkers = measured{k: 2, batch: 64, step: 80 * time.Millisecond, compute: 75 * time.Millisecond, v: 1}
)

func TestGoodputDecisions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		params     string
		h          *History
		minW, maxW int
		action     Action
		count      int
		settled    bool
		reason     string
		goodput    map[string]float64 // numbers, within 1 %
	}{
		{"one size measured: perfect scaling predicted, explore to twice it",
			`{}`, goodputHistory(oneWorker), 1, 0, Grow, 1, false, "twice the largest size measured",
			// without network data T_net ≈ 0: goodput at 2 = 64/0.075
			map[string]float64{"goodput": 640, "goodput_target": 853.33, "alpha_c": 0.05, "beta_c": 0.05 / 64}},
		// Batches up to 512 allowed, one worker measured (T_net ≈ 0).
		// All noise (efficiency 1): throughput m/(0.05 + 0.05m/64) rises
		// with m, so one worker runs 512 (1137.8 samples/s) and two 2×256:
		// 512/0.25 = 2048.
		{"batch growth, all noise: the largest batch",
			`{"max_batch": 512}`, goodputHistory(oneWorker), 1, 0, Grow, 1, false, "twice the largest size measured",
			map[string]float64{"goodput": 1137.78, "goodput_target": 2048, "micro_batch_target": 256}},
		// Noise scale φ = M0·var/sqr = 64: efficiency 128/(64+M). One
		// worker: goodput 128·64/0.05 · m/(64+m)², highest at m = 64: 640.
		// Two: 128·128/0.05 · m/((64+m)(64+2m)), highest at m = √2048 =
		// 45.25; the grid's M_8 = 64·8^(8/49) = 89.9 gives m = 45:
		// 327680·45/(109·154) = 878.4.
		{"batch growth, noise scale 64: efficiency decides the batch",
			`{"max_batch": 512}`, goodputHistory(measured{k: 1, batch: 64, step: 100 * time.Millisecond, compute: 100 * time.Millisecond, sqr: 1, v: 1}),
			1, 0, Grow, 1, false, "twice the largest size measured",
			map[string]float64{"goodput": 640, "goodput_target": 878.4, "micro_batch_target": 45, "noise_scale": 64}},
		{"every added worker worth > 0.1: grow to 4 (exploring)",
			`{"hysteresis": 0}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Grow, 2, false, "every worker up to 4",
			map[string]float64{"goodput": 800, "goodput_target": 948.15, "efficiency_3": 0.2857, "efficiency_4": 0.1111, "alpha_n": 0.005}},
		// With the default hysteresis 0.05 a worker must add more than
		// 0.15 to be added: the fourth's 0.111 is not enough, the third's
		// 0.286 is.
		{"hysteresis: grow to 3 only",
			`{}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Grow, 1, false, "worker 4 would add 0.111 of a worker's goodput, ≤ threshold 0.15",
			map[string]float64{"goodput_target": 914.29}},
		// And at most 0.25 to be removed: the second's 0.25 (threshold
		// 0.3) is within the band: the job stays at 2.
		{"hysteresis: threshold 0.3 keeps 2",
			`{"threshold": 0.3, "hysteresis": 0.1}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Hold, 0, true, "within the hysteresis band", nil},
		{"threshold 0.2: grow to 3",
			`{"threshold": 0.2}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Grow, 1, false, "worker 4 would add 0.111",
			map[string]float64{"goodput_target": 914.29}},
		{"threshold 0.3: back to 1",
			`{"threshold": 0.3, "hysteresis": 0}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Shrink, 1, false, "worker 2 would add 0.25",
			map[string]float64{"goodput": 800, "goodput_target": 640}},
		{"max workers 3: grow to 3, not exploring",
			`{}`, goodputHistory(oneWorker, twoWorkers), 1, 3, Grow, 1, false, "every worker up to 3 adds",
			map[string]float64{"goodput_target": 914.29}},
		{"below min workers: grow to it, the current size still predicted",
			`{}`, goodputHistory(oneWorker), 2, 0, Grow, 1, false, "every worker up to 2",
			map[string]float64{"goodput": 640, "goodput_target": 853.33}},
		{"min workers 2: held at 2 although 1 would be chosen",
			`{"threshold": 0.3}`, goodputHistory(oneWorker, twoWorkers), 2, 0, Hold, 0, true, "settled", nil},
		// Three workers measured as predicted (step 0.0721875 s): the
		// model is unchanged, 3 is the target, now measured: settled.
		{"at the target: settled",
			`{"threshold": 0.2}`, goodputHistory(oneWorker, twoWorkers, measured{k: 3, batch: 66,
				step: 72187500, compute: 67187500, v: 1}), 1, 0, Hold, 0, true, "settled",
			map[string]float64{"goodput": 914.29, "target": 3}},
		// The sync of two workers takes 0.025 s: T_iter(2) = 0.1, goodput
		// 640 = one worker's; the second adds nothing.
		{"the sync eats the gain: shrink to 1",
			`{}`, goodputHistory(oneWorker, measured{k: 2, batch: 64, step: 100 * time.Millisecond, compute: 75 * time.Millisecond, v: 1}),
			1, 0, Shrink, 1, false, "worker 2 would add",
			map[string]float64{"goodput": 640, "alpha_n": 0.025}},
		// With a price: U − C = −v(elapsed + W/G)/3600 − (W/G)·k·P/3600 is
		// highest where (v + kP)/G(k) is lowest. v = 20, P = 2:
		// 22/640 = 0.034375, 24/800 = 0.03, 26/914.29 = 0.028437,
		// 28/948.15 = 0.029531: 3 workers.
		{"price 2: 3 workers",
			`{"price_per_worker_hour": 2, "value_per_hour": 20, "total_steps": 10000}`, goodputHistory(oneWorker, twoWorkers), 1, 0,
			Grow, 1, false, "best utility minus cost", map[string]float64{"remaining_steps": 10000 - 60}},
		// P = 10: 30/640 = 0.046875, 40/800 = 0.05: one worker.
		{"price 10: 1 worker",
			`{"price_per_worker_hour": 10, "value_per_hour": 20, "total_steps": 10000}`, goodputHistory(oneWorker, twoWorkers), 1, 0,
			Shrink, 1, false, "best utility minus cost", nil},
		// Step utility, deadline 2 h, an hour gone: 9940 steps of 64
		// samples left take 994 s at one worker, well in time; more
		// workers only cost.
		{"price with a deadline met by one worker",
			`{"price_per_worker_hour": 2, "utility": "step", "value": 100, "deadline": "2h", "total_steps": 10000}`,
			goodputHistory(oneWorker, twoWorkers), 1, 0, Shrink, 1, false, "best utility minus cost", nil},
		{"price without the job's length",
			`{"price_per_worker_hour": 2, "value_per_hour": 20}`, goodputHistory(oneWorker, twoWorkers), 1, 0,
			Hold, 0, false, "needs the job's length", nil},
		// Micro-batches of at most 16 and no accumulation: one or two
		// workers cannot hold M0 = 64; 4 can (16 each).
		{"small sizes infeasible",
			`{"max_micro_batch": 16}`, goodputHistory(oneWorker, twoWorkers), 1, 0, Grow, 2, false, "every worker up to 4",
			map[string]float64{"goodput": 0, "goodput_target": 948.15}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heur, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(tc.params)})
			if err != nil {
				t.Fatal(err)
			}
			tc.h.MinWorkers, tc.h.MaxWorkers = tc.minW, tc.maxW
			d, err := heur.Decide(context.Background(), tc.h)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%v", d)
			if d.Action != tc.action || d.Count != tc.count || d.Settled != tc.settled || !strings.Contains(d.Reason, tc.reason) {
				t.Fatalf("decision %v (settled %v); want %v by %d (settled %v) with %q", d, d.Settled, tc.action, tc.count, tc.settled, tc.reason)
			}
			for k, want := range tc.goodput {
				got, ok := d.Numbers[k]
				if !ok || math.Abs(got-want) > 0.01*math.Abs(want)+1e-9 {
					t.Errorf("%s = %v, want %v (numbers %v)", k, got, want, d.Numbers)
				}
			}
		})
	}
}

// TestGoodputMeasuresFirst: the current world is judged only after
// min_steps steady steps, and an unchanged one at most every eval_every.
func TestGoodputMeasuresFirst(t *testing.T) {
	heur, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(`{"min_steps": 40, "eval_every": 5}`)})
	if err != nil {
		t.Fatal(err)
	}
	h := goodputHistory(oneWorker) // 30 steps
	if d, _ := heur.Decide(context.Background(), h); d.Action != Hold || !strings.Contains(d.Reason, "measuring 1 worker: 30/40") {
		t.Fatalf("decision %v", d)
	}
	h = goodputHistory(oneWorker, oneWorker) // the current world has 30 steps too
	h.Periods[1].Steps = append(h.Periods[1].Steps, h.Periods[0].Steps[:10]...)
	if d, _ := heur.Decide(context.Background(), h); d.Action != Grow {
		t.Fatalf("decision %v", d)
	}
	h.Step += 4
	if d, _ := heur.Decide(context.Background(), h); d.Action != Hold || !strings.Contains(d.Reason, "next evaluation at step") {
		t.Fatalf("decision %v", d)
	}
	h.Step++
	if d, _ := heur.Decide(context.Background(), h); d.Action != Grow {
		t.Fatalf("decision %v", d)
	}
}

// TestGoodputObservation: a step becomes the throughput model's input with
// the micro-batch from the global batch and the accumulation, and the sync
// time from the members' mean compute time.
func TestGoodputObservation(t *testing.T) {
	g := &goodputHeuristic{cfg: goodputConfig{WorkersPerNode: 4}}
	ms := time.Millisecond
	s := StepStats{GlobalBatch: 100, Time: 50 * ms, Accum: 1, Compute: map[string]time.Duration{"a": 30 * ms, "b": 40 * ms, "c": 35 * ms}}
	o, ok := g.observation(6, s)
	// 100 samples over 6 workers × 2 micro-batches: ⌈8.33⌉ = 9; 6 workers
	// on machines of 4: 2 nodes; sync = 50 − 35 ms.
	if !ok || o.Nodes != 2 || o.Replicas != 6 || o.MicroBatch != 9 || o.Accum != 1 || math.Abs(o.StepTime-0.05) > 1e-12 || math.Abs(o.SyncTime-0.015) > 1e-12 {
		t.Fatalf("observation %+v, %v", o, ok)
	}
	// Compute above the step time: no sync.
	s.Compute = map[string]time.Duration{"a": 60 * ms}
	if o, ok := g.observation(6, s); !ok || o.SyncTime != 0 {
		t.Fatalf("observation %+v, %v", o, ok)
	}
	// No compute reported: all of the step counts as sync, but for a sliver.
	s.Compute = nil
	if o, ok := g.observation(6, s); !ok || math.Abs(o.SyncTime-0.05*0.999) > 1e-12 {
		t.Fatalf("observation %+v, %v", o, ok)
	}
	for _, bad := range []StepStats{{GlobalBatch: 0, Time: ms}, {GlobalBatch: 8, Time: 0}, {GlobalBatch: 8, Time: ms, Accum: -1}} {
		if _, ok := g.observation(2, bad); ok {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestGoodputConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		params, want string
	}{
		{`{"threshold": -1}`, "threshold"},
		{`{"hysteresis": -0.1}`, "hysteresis"},
		{`{"workers_per_node": 0}`, "workers_per_node"},
		{`{"min_steps": 0}`, "min_steps"},
		{`{"eval_every": 0}`, "eval_every"},
		{`{"init_batch": -1}`, "init_batch"},
		{`{"init_batch": 64, "max_batch": 32}`, "maximum batch 32 is below the initial batch 64"},
		{`{"init_batch": 64, "min_micro_batch": 32, "max_micro_batch": 16}`, "micro-batch bounds"},
		{`{"value_per_hour": 20}`, "need price_per_worker_hour"},
		{`{"price_per_worker_hour": 2}`, "value_per_hour > 0"},
		{`{"price_per_worker_hour": -2, "value_per_hour": 20}`, "price_per_worker_hour must be > 0"},
		{`{"price_per_worker_hour": 2, "utility": "step", "value": 10}`, "deadline > 0"},
		{`{"grow_by": 2}`, "unknown field"},
	} {
		_, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(tc.params)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.params, err, tc.want)
		}
	}
	// At decision time, what the job does not report, and M0 from the
	// first step against limits that do not fit it, are errors (the engine
	// logs each once and holds).
	for _, tc := range []struct {
		params string
		h      *History
		want   string
	}{
		{`{}`, goodputHistory(measured{k: 1, batch: 64, step: 100 * time.Millisecond, compute: 100 * time.Millisecond}), "no gradient statistics reported"},
		{`{}`, goodputHistory(measured{k: 1, step: 100 * time.Millisecond, compute: 100 * time.Millisecond, v: 1}), "reports no samples"},
		{`{"max_batch": 32}`, goodputHistory(oneWorker), "initial batch 64 from the first step"},
	} {
		heur, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(tc.params)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := heur.Decide(context.Background(), tc.h); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: decision error %v, want one about %q", tc.params, err, tc.want)
		}
	}
}

// TestGoodputExploresToTheTarget runs a simulated job whose steps follow a
// known model, with the batch size its adaptive loop would pick at each size
// (the true model's optimum), and the goodput heuristic deciding: starting
// from one worker and measuring only the sizes it goes to, it must settle
// where the true model's goodput curve says (each added worker adding more
// than 0.1 of a worker's goodput), without trying every size.
func TestGoodputExploresToTheTarget(t *testing.T) {
	truth := goodput.Model{
		Perf:      goodput.PerfParams{AlphaC: 0.02, BetaC: 0.0005, AlphaN: 0.03, BetaN: 0.004, AlphaR: 0.01, BetaR: 0.001, Gamma: 1.5},
		Grad:      goodput.GradParams{Sqr: 1, Var: 4}, // noise scale 4·M0 = 256
		InitBatch: 64,
	}
	lim := goodput.Limits{MaxBatch: 1024, MaxMicroBatch: 128, Accumulation: true}
	const maxW = 16
	// The oracle: the rule applied to the true model.
	want := 1
	for k := 2; k <= maxW; k++ {
		prev, _ := truth.Optimize(k-1, k-1, lim)
		next, _ := truth.Optimize(k, k, lim)
		if (next.Goodput-prev.Goodput)/(prev.Goodput/float64(k-1)) <= 0.1 {
			break
		}
		want = k
	}
	// Without hysteresis, for the oracle's exact rule.
	heur, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(`{"init_batch": 64, "max_batch": 1024, "max_micro_batch": 128, "accumulation": true, "hysteresis": 0}`)})
	if err != nil {
		t.Fatal(err)
	}
	h := &History{Start: simStart, Now: simStart, MaxWorkers: maxW}
	k, tried := 1, map[int]bool{}
	for round := 0; ; round++ {
		if round == 12 {
			t.Fatalf("no settled decision after %d rounds; sizes tried %v", round, tried)
		}
		tried[k] = true
		c, _ := truth.Optimize(k, k, lim)
		acc := truth.Perf.AccumTime(c.MicroBatch)
		step := truth.Perf.StepTime(k, k, c.MicroBatch, c.Accum)
		w := measured{k: k, batch: c.Batch(k), accum: c.Accum, step: time.Duration(step * 1e9),
			compute: time.Duration(acc * float64(c.Accum+1) * 1e9), sqr: truth.Grad.Sqr, v: truth.Grad.Var}
		next := goodputHistory(w).Periods[0]
		next.Epoch = uint64(round + 1)
		for i := range next.Steps {
			next.Steps[i].Step = h.Step + int64(i) + 1
		}
		h.Step += int64(len(next.Steps))
		h.Periods = append(h.Periods, next)
		d, err := heur.Decide(context.Background(), h)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d workers (batch %d = %d×%d×%d): %v", k, c.Batch(k), k, c.MicroBatch, c.Accum+1, d)
		switch d.Action {
		case Grow:
			k = h.Clamp(k + d.Count)
		case Shrink:
			k = h.Clamp(k - d.Count)
		default:
			if !d.Settled {
				t.Fatalf("hold without settling: %v", d)
			}
			if k != want {
				t.Fatalf("settled at %d workers, the true model's target is %d", k, want)
			}
			if len(tried) >= want {
				t.Fatalf("tried %d sizes (%v) to settle at %d", len(tried), tried, want)
			}
			return
		}
	}
}

// TestGoodputHysteresis: two fits that disagree by little about the second
// worker — it adds 0.12 of a worker's goodput by one, 0.08 by the other,
// around the threshold 0.1 — as successive refits of a job of at most two
// workers measuring with some noise. Without hysteresis the job flips between one and two workers
// at every refit, paying a transition each time; with the default band
// (0.05) it stays where it is.
func TestGoodputHysteresis(t *testing.T) {
	// Two workers' step for the second to add eff: 64/(640·(1+eff)).
	twoAt := func(eff float64) measured {
		w := twoWorkers
		w.step = time.Duration(64 / (640 * (1 + eff)) * 1e9)
		return w
	}
	fits := []measured{twoAt(0.12), twoAt(0.08)}
	for _, tc := range []struct {
		params string
		flips  int
	}{
		{`{"hysteresis": 0}`, 6},
		{`{}`, 0},
	} {
		t.Run(tc.params, func(t *testing.T) {
			k, flips := 1, 0
			for round := range 6 {
				two := fits[round%2]
				cur := oneWorker
				if k == 2 {
					cur = two
				}
				heur, err := NewRegistry().New(Spec{Name: "goodput", Params: []byte(tc.params)})
				if err != nil {
					t.Fatal(err)
				}
				h := goodputHistory(oneWorker, two, cur)
				h.MaxWorkers = 2
				d, err := heur.Decide(context.Background(), h)
				if err != nil {
					t.Fatal(err)
				}
				if want := []float64{0.12, 0.08}[round%2]; math.Abs(d.Numbers["efficiency_2"]-want) > 0.005 {
					t.Fatalf("round %d: the fit says the second worker adds %v, want %v", round, d.Numbers["efficiency_2"], want)
				}
				t.Logf("round %d at %d workers: %v", round, k, d)
				switch d.Action {
				case Grow:
					k, flips = k+d.Count, flips+1
				case Shrink:
					k, flips = k-d.Count, flips+1
				}
			}
			if flips != tc.flips {
				t.Fatalf("%d changes of size in 6 refits, want %d", flips, tc.flips)
			}
		})
	}
}
