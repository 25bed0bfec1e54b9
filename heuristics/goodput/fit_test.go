package goodput

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/gonum/diff/fd"
)

// synthetic measures truth at the given configurations with multiplicative
// Gaussian noise of relative size noise, reps steps each, as the sync layer
// would report them (step and sync time).
func synthetic(truth PerfParams, cfgs []config, reps int, noise float64, seed uint64) *Profile {
	rng := rand.New(rand.NewPCG(seed, 99))
	var prof Profile
	for _, c := range cfgs {
		for range reps {
			acc := truth.AccumTime(c.micro) * (1 + noise*rng.NormFloat64())
			opt := truth.OptimTime(c.nodes, c.replicas, c.micro) * (1 + noise*rng.NormFloat64())
			step := float64(c.accum)*acc + opt
			// The last micro-batch computes for acc too; the rest of it
			// is waiting for the sync (never negative).
			sync := max(0, opt-acc)
			if err := prof.Add(Observation{Nodes: c.nodes, Replicas: c.replicas, MicroBatch: c.micro, Accum: c.accum, StepTime: step, SyncTime: sync}); err != nil {
				panic(err)
			}
		}
	}
	return &prof
}

func paramVector(p PerfParams) [nParams]float64 {
	return [nParams]float64{p.AlphaC, p.BetaC, p.AlphaN, p.BetaN, p.AlphaR, p.BetaR, p.Gamma}
}

func grid(nodeReplicas [][2]int, micros, accums []int) []config {
	var out []config
	for _, nr := range nodeReplicas {
		for _, m := range micros {
			for _, s := range accums {
				out = append(out, config{nr[0], nr[1], m, s})
			}
		}
	}
	return out
}

// TestFitRecovers: from noisy measurements of a known model at a spread of
// configurations, the fit recovers the parameters and predicts the step time
// of configurations it has not seen.
func TestFitRecovers(t *testing.T) {
	seen := [][2]int{{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 6}, {2, 2}, {2, 4}, {3, 6}, {4, 8}, {4, 16}}
	unseen := grid([][2]int{{1, 5}, {1, 8}, {2, 6}, {4, 12}, {8, 32}}, []int{24, 48, 100, 200}, []int{0, 1, 3})
	for _, tc := range []struct {
		name  string
		truth PerfParams
		noise float64
		// checked: the parameters the data determine (relative tolerance
		// paramTol); predTol: of the predicted step times
		checked           []int
		paramTol, predTol float64
	}{
		{"exact", PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2.5}, 0,
			[]int{iAlphaC, iBetaC, iAlphaN, iBetaN, iAlphaR, iBetaR, iGamma}, 1e-6, 1e-6},
		// With noise, a network time mostly hidden behind the compute
		// (γ = 2.5, T_net well below T_acc within a node) leaves α_r, β_r
		// and γ loosely determined (over 50 seeds at 10 % noise α_r
		// varied by up to 80 %): only the compute and inter-node terms
		// are checked, and the predictions.
		{"5 % noise", PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2.5}, 0.05,
			[]int{iAlphaC, iBetaC, iAlphaN, iBetaN}, 0.15, 0.05},
		{"no overlap, 5 % noise", PerfParams{AlphaC: 0.005, BetaC: 0.0002, AlphaN: 0.1, BetaN: 0.02, AlphaR: 0.03, BetaR: 0.005, Gamma: 1}, 0.05,
			[]int{iAlphaC, iBetaC, iAlphaN, iBetaN, iAlphaR, iBetaR}, 0.15, 0.05},
		// Network-bound: the times are determined, the overlap γ is not.
		{"network-bound, 10 % noise", PerfParams{AlphaC: 0.001, BetaC: 5e-5, AlphaN: 0.2, BetaN: 0.01, AlphaR: 0.05, BetaR: 0.01, Gamma: 4}, 0.10,
			[]int{iAlphaC, iBetaC, iAlphaN, iBetaN, iAlphaR, iBetaR}, 0.15, 0.08},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := synthetic(tc.truth, grid(seen, []int{16, 32, 64, 128}, []int{0, 2}), 10, tc.noise, 1)
			got, err := prof.Fit()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("truth %+v\nfit   %+v", tc.truth, got)
			// The fit is the optimum of its loss: no worse there than the
			// truth (every regime is seen, nothing is pinned).
			obj := newObjective(prof.Points(), [nParams]float64{}, [nParams]bool{})
			lossAt := func(p PerfParams) float64 { return obj.value(obj.encode(paramVector(p))) }
			if lf, lt := lossAt(got), lossAt(tc.truth); lf > lt+1e-9 {
				t.Errorf("loss %.6g at the fit, %.6g at the truth", lf, lt)
			}
			names := [nParams]string{"alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma"}
			gv, tv := paramVector(got), paramVector(tc.truth)
			for _, i := range tc.checked {
				if math.Abs(gv[i]-tv[i]) > tc.paramTol*tv[i] {
					t.Errorf("%s = %.6g, want %.6g ± %g %%", names[i], gv[i], tv[i], 100*tc.paramTol)
				}
			}
			for _, c := range unseen {
				want := tc.truth.StepTime(c.nodes, c.replicas, c.micro, c.accum)
				if pred := got.StepTime(c.nodes, c.replicas, c.micro, c.accum); math.Abs(pred-want) > tc.predTol*want {
					t.Errorf("%+v: predicted step %.4g s, true %.4g s", c, pred, want)
				}
			}
		})
	}
}

// TestFitUnseenRegimes checks the pinned parameters and the prior for what
// the data cannot tell.
func TestFitUnseenRegimes(t *testing.T) {
	truth := PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2}
	for _, tc := range []struct {
		name  string
		cfgs  []config
		check func(t *testing.T, p PerfParams, pts []Point)
	}{
		{"one micro-batch size: alpha_c = mean(T_acc)/2", grid([][2]int{{1, 1}, {1, 2}, {2, 4}}, []int{32}, []int{0}),
			func(t *testing.T, p PerfParams, pts []Point) {
				mean := 0.0
				for _, q := range pts {
					mean += q.AccumTime / float64(len(pts))
				}
				near(t, "alpha_c", p.AlphaC, mean/2, 1e-12)
				near(t, "T_acc(32)", p.AccumTime(32), mean, 0.02)
			}},
		{"one replica only: no network, inter-node ≥ 1.1 × intra-node", grid([][2]int{{1, 1}}, []int{16, 64}, []int{0}),
			func(t *testing.T, p PerfParams, _ []Point) {
				near(t, "alpha_r", p.AlphaR, paramFloor, 0)
				near(t, "beta_r", p.BetaR, paramFloor, 0)
				near(t, "alpha_n", p.AlphaN, 1.1*paramFloor, 1e-12)
				near(t, "beta_n", p.BetaN, 1.1*paramFloor, 1e-12)
			}},
		{"one node: inter-node pinned then raised to 1.1 × intra-node", grid([][2]int{{1, 1}, {1, 2}, {1, 4}}, []int{16, 64}, []int{0}),
			func(t *testing.T, p PerfParams, _ []Point) {
				if p.AlphaR < 0.005 {
					t.Errorf("alpha_r = %v not fitted", p.AlphaR)
				}
				near(t, "alpha_n", p.AlphaN, 1.1*p.AlphaR, 1e-12)
				near(t, "beta_n", p.BetaN, math.Max(1.1*p.BetaR, paramFloor), 1e-12)
			}},
		{"at most two replicas: no retrogression", grid([][2]int{{1, 1}, {1, 2}, {2, 2}}, []int{16, 64}, []int{0}),
			func(t *testing.T, p PerfParams, _ []Point) {
				near(t, "beta_r", p.BetaR, paramFloor, 0)
				near(t, "beta_n", p.BetaN, paramFloor, 0)
				if p.AlphaR < 0.005 || p.AlphaN < 0.025 {
					t.Errorf("alpha_r = %v, alpha_n = %v not fitted", p.AlphaR, p.AlphaN)
				}
			}},
		{"multi-node only: intra-node pinned, no prior", grid([][2]int{{2, 2}, {2, 4}, {4, 8}}, []int{16, 64}, []int{0}),
			func(t *testing.T, p PerfParams, _ []Point) {
				near(t, "alpha_r", p.AlphaR, paramFloor, 0)
				near(t, "beta_r", p.BetaR, paramFloor, 0)
				near(t, "alpha_n", p.AlphaN, truth.AlphaN, 0.05)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prof := synthetic(truth, tc.cfgs, 5, 0.02, 3)
			p, err := prof.Fit()
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, p, prof.Points())
		})
	}
}

// TestFitReachesBounds: with no retrogression in the data (β = 1e-8) and the
// overlap at its upper bound, the fit goes to the bounds.
func TestFitReachesBounds(t *testing.T) {
	truth := PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: paramFloor, AlphaR: 0.01, BetaR: paramFloor, Gamma: 1}
	prof := synthetic(truth, grid([][2]int{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 4}, {4, 16}}, []int{16, 64, 256}, []int{0}), 1, 0, 1)
	got, err := prof.Fit()
	if err != nil {
		t.Fatal(err)
	}
	if got.BetaN > 1e-6 || got.BetaR > 1e-6 || got.Gamma > 1+1e-6 {
		t.Errorf("fit %+v: want beta_n, beta_r ≈ 1e-8 and gamma ≈ 1", got)
	}
	near(t, "alpha_n", got.AlphaN, truth.AlphaN, 1e-4)
	near(t, "alpha_r", got.AlphaR, truth.AlphaR, 1e-4)
}

// TestFitGradient checks the analytic gradient against finite differences,
// at random points, for every pattern of pinned parameters.
func TestFitGradient(t *testing.T) {
	truth := PerfParams{AlphaC: 0.02, BetaC: 0.001, AlphaN: 0.05, BetaN: 0.005, AlphaR: 0.01, BetaR: 0.002, Gamma: 2.5}
	rng := rand.New(rand.NewPCG(5, 5))
	for _, nr := range [][][2]int{
		{{1, 1}, {1, 2}, {1, 4}, {2, 2}, {2, 8}},
		{{1, 1}, {1, 2}},
		{{2, 4}, {4, 8}},
		{{1, 1}},
	} {
		pts := synthetic(truth, grid(nr, []int{16, 64}, []int{0, 1}), 3, 0.1, 8).Points()
		var theta [nParams]float64
		var pinned [nParams]bool
		for i := range theta {
			theta[i] = 0.05
		}
		theta[iGamma] = 2
		pinned[iBetaR] = len(nr) == 2
		obj := newObjective(pts, theta, pinned)
		for range 20 {
			x := make([]float64, len(obj.free))
			for j := range x {
				// times from 1e-4 to 0.1 s, either sign of u; any γ
				x[j] = (0.01 + 0.3*rng.Float64()) * float64(1-2*rng.IntN(2))
				if obj.free[j] == iGamma {
					x[j] = 3 * rng.Float64()
				}
			}
			got := make([]float64, len(x))
			obj.gradient(got, x)
			want := fd.Gradient(nil, obj.value, x, &fd.Settings{Formula: fd.Central, Step: 1e-6})
			for j := range x {
				if math.Abs(got[j]-want[j]) > 1e-5*math.Max(1, math.Abs(want[j])) {
					t.Fatalf("%v: ∂f/∂x[%d] (param %d) = %v, finite differences %v", nr, j, obj.free[j], got[j], want[j])
				}
			}
		}
	}
}

func TestFitErrors(t *testing.T) {
	good := Point{Nodes: 1, Replicas: 1, MicroBatch: 8, AccumTime: 0.1, OptimTime: 0.1}
	for _, tc := range []struct {
		pts  []Point
		want string
	}{
		{nil, "nothing to fit"},
		{[]Point{good, {Nodes: 2, Replicas: 1, MicroBatch: 8, AccumTime: 0.1, OptimTime: 0.1}}, "nodes ≤ replicas"},
		{[]Point{{Nodes: 1, Replicas: 1, MicroBatch: 0, AccumTime: 0.1, OptimTime: 0.1}}, "micro-batch"},
		{[]Point{{Nodes: 1, Replicas: 1, MicroBatch: 8, AccumTime: 0, OptimTime: 0.1}}, "times > 0"},
		{[]Point{{Nodes: 1, Replicas: 1, MicroBatch: 8, AccumTime: 0.1, OptimTime: math.NaN()}}, "times > 0"},
		{[]Point{{Nodes: 1, Replicas: 1, MicroBatch: 8, AccumTime: 0.1, OptimTime: math.Inf(1)}}, "times > 0"},
	} {
		if _, err := Fit(tc.pts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Fit(%v): %v, want an error about %q", tc.pts, err, tc.want)
		}
	}
	var prof Profile
	for _, o := range []Observation{
		{Nodes: 0, Replicas: 1, MicroBatch: 8, StepTime: 1},
		{Nodes: 1, Replicas: 1, MicroBatch: 8, Accum: -1, StepTime: 1},
		{Nodes: 1, Replicas: 1, MicroBatch: 8, StepTime: 1, SyncTime: 1},
		{Nodes: 1, Replicas: 1, MicroBatch: 8, StepTime: 1, SyncTime: -0.1},
		{Nodes: 1, Replicas: 1, MicroBatch: 8, StepTime: math.NaN()},
		{Nodes: 1, Replicas: 1, MicroBatch: 8, StepTime: math.Inf(1)},
	} {
		if err := prof.Add(o); err == nil {
			t.Errorf("Add(%+v) accepted", o)
		}
	}
	if prof.Len() != 0 {
		t.Errorf("rejected observations counted: %d configurations", prof.Len())
	}
}

// TestProfileAggregates checks how steps become points: a step's compute time
// spread over its micro-batches, its last micro-batch's time the step minus
// the accumulated ones, configurations keyed without the accumulation.
func TestProfileAggregates(t *testing.T) {
	var prof Profile
	for _, o := range []Observation{
		// compute 0.3 over 3 micro-batches: 0.1 each; last: 0.5 − 2·0.1 = 0.3
		{Nodes: 1, Replicas: 2, MicroBatch: 16, Accum: 2, StepTime: 0.5, SyncTime: 0.2},
		// compute 0.12 in 1; last 0.2
		{Nodes: 1, Replicas: 2, MicroBatch: 16, Accum: 0, StepTime: 0.2, SyncTime: 0.08},
		{Nodes: 2, Replicas: 4, MicroBatch: 8, Accum: 0, StepTime: 0.4, SyncTime: 0.3},
	} {
		if err := prof.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	pts := prof.Points()
	if len(pts) != 2 || prof.Len() != 2 || prof.MaxReplicas() != 4 {
		t.Fatalf("points %+v, max replicas %d", pts, prof.MaxReplicas())
	}
	// (0.3 + 0.12)/4 micro-batches; (0.3 + 0.2)/2 steps
	near(t, "accum", pts[0].AccumTime, 0.42/4, 1e-12)
	near(t, "optim", pts[0].OptimTime, 0.25, 1e-12)
	near(t, "accum 2", pts[1].AccumTime, 0.1, 1e-12)
	near(t, "optim 2", pts[1].OptimTime, 0.4, 1e-12)
	prof.Reset()
	if prof.Len() != 0 || len(prof.Points()) != 0 {
		t.Fatal("Reset left points")
	}
}

// A profile's entries, added to another profile, give it the same points;
// added to a profile with steps of its own, they count with them as the steps
// would; an entry Add could not have made is refused and changes nothing.
func TestProfileEntries(t *testing.T) {
	obs := []Observation{
		{Nodes: 1, Replicas: 2, MicroBatch: 16, Accum: 2, StepTime: 0.5, SyncTime: 0.2},
		{Nodes: 1, Replicas: 2, MicroBatch: 16, Accum: 0, StepTime: 0.2, SyncTime: 0.08},
		{Nodes: 2, Replicas: 4, MicroBatch: 8, Accum: 0, StepTime: 0.4, SyncTime: 0.3},
	}
	var all, before, since Profile
	for i, o := range obs {
		if err := all.Add(o); err != nil {
			t.Fatal(err)
		}
		into := &before
		if i > 0 {
			into = &since
		}
		if err := into.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	copied := &Profile{}
	for _, e := range all.Entries() {
		if err := copied.AddEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(copied.Points(), all.Points()) || !slices.Equal(all.Clone().Points(), all.Points()) {
		t.Errorf("copied %+v, cloned %+v; want %+v", copied.Points(), all.Clone().Points(), all.Points())
	}
	merged := since.Clone()
	for _, e := range before.Entries() {
		if err := merged.AddEntry(e); err != nil {
			t.Fatal(err)
		}
	}
	// since saw the 4-replica configuration first: the order differs.
	byReplicas := func(a, b Point) int { return a.Replicas - b.Replicas }
	got, want := slices.SortedFunc(slices.Values(merged.Points()), byReplicas), slices.SortedFunc(slices.Values(all.Points()), byReplicas)
	if len(got) != len(want) {
		t.Fatalf("merged %+v, want %+v", got, want)
	}
	for i := range got {
		near(t, "merged accum", got[i].AccumTime, want[i].AccumTime, 1e-12)
		near(t, "merged optim", got[i].OptimTime, want[i].OptimTime, 1e-12)
	}
	if (*Profile)(nil).Entries() != nil || (*Profile)(nil).Clone().Len() != 0 {
		t.Error("a nil profile has entries")
	}

	good := ProfileEntry{Nodes: 1, Replicas: 2, MicroBatch: 16, AccumTime: 0.4, AccumCount: 4, OptimTime: 0.5, OptimCount: 2}
	for _, tc := range []struct {
		name string
		bad  func(e *ProfileEntry)
	}{
		{"no node", func(e *ProfileEntry) { e.Nodes = 0 }},
		{"more nodes than replicas", func(e *ProfileEntry) { e.Nodes = 3 }},
		{"a million replicas and more", func(e *ProfileEntry) { e.Nodes, e.Replicas = 1, 1<<20+1 }},
		{"no micro-batch", func(e *ProfileEntry) { e.MicroBatch = 0 }},
		{"no step", func(e *ProfileEntry) { e.OptimCount = 0 }},
		{"fewer micro-batches than steps", func(e *ProfileEntry) { e.AccumCount = 1 }},
		{"a count to overflow on", func(e *ProfileEntry) { e.AccumCount = math.MaxInt64 }},
		{"negative steps", func(e *ProfileEntry) { e.OptimCount, e.AccumCount = -1, -1 }},
		{"no compute time", func(e *ProfileEntry) { e.AccumTime = 0 }},
		{"negative time", func(e *ProfileEntry) { e.OptimTime = -1 }},
		{"NaN", func(e *ProfileEntry) { e.AccumTime = math.NaN() }},
		{"infinite", func(e *ProfileEntry) { e.OptimTime = math.Inf(1) }},
		{"a mean of 0 (the sum underflows)", func(e *ProfileEntry) { e.AccumTime, e.AccumCount = 5e-324, 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := all.Clone()
			was := p.Entries()
			e := good
			tc.bad(&e)
			if err := p.AddEntry(e); err == nil {
				t.Fatalf("AddEntry(%+v) took it", e)
			}
			if !slices.Equal(p.Entries(), was) {
				t.Errorf("a refused entry changed the profile: %+v, was %+v", p.Entries(), was)
			}
		})
	}
	if err := (&Profile{}).AddEntry(good); err != nil {
		t.Errorf("AddEntry(%+v): %v", good, err)
	}
}

// FuzzProfileEntry: whatever an entry holds, AddEntry refuses it or takes it
// into points with mean times within its bounds, which Fit takes without panicking.
func FuzzProfileEntry(f *testing.F) {
	f.Add(1, 2, 16, 0.4, int64(4), 0.5, int64(2))
	f.Add(2, 4, 8, 1e-300, int64(1), 1e300, int64(1))
	f.Add(0, -1, 0, math.NaN(), int64(-1), math.Inf(-1), int64(0))
	f.Fuzz(func(t *testing.T, nodes, replicas, micro int, accumTime float64, accumCount int64, optimTime float64, optimCount int64) {
		p := &Profile{}
		e := ProfileEntry{Nodes: nodes, Replicas: replicas, MicroBatch: micro, AccumTime: accumTime, AccumCount: accumCount, OptimTime: optimTime, OptimCount: optimCount}
		if err := p.AddEntry(e); err != nil {
			if p.Len() != 0 {
				t.Fatalf("a refused entry %+v left %+v", e, p.Entries())
			}
			return
		}
		for _, pt := range p.Points() {
			if !(pt.AccumTime >= minEntryMean && pt.AccumTime <= maxEntryMean && pt.OptimTime >= minEntryMean && pt.OptimTime <= maxEntryMean) {
				t.Fatalf("entry %+v gives the point %+v", e, pt)
			}
		}
		_, _ = p.Fit()
	})
}
