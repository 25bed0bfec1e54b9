package simulator

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// polluxDir finds Pollux's simulator inputs: shared/pollux beside the clone
// (CI) or beside a directory holding it (a worktree), searched upwards from
// the module root. Tests that need them skip when they are absent.
func polluxDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		if dir == filepath.Dir(dir) {
			t.Fatal("no go.mod above the test's directory")
		}
	}
	for up := filepath.Dir(dir); ; up = filepath.Dir(up) {
		p := filepath.Join(up, "shared", "pollux")
		if _, err := os.Stat(filepath.Join(p, "traces")); err == nil {
			return p
		}
		if up == filepath.Dir(up) {
			t.Skipf("Pollux's traces are not beside the clone (want ../shared/pollux/traces from %s): skipping", dir)
		}
	}
}

func loadTestTraces(t testing.TB) map[string]*Trace {
	t.Helper()
	traces, err := LoadTraces(filepath.Join(polluxDir(t), "traces"), DefaultModels())
	if err != nil {
		t.Fatal(err)
	}
	return traces
}

func TestPlacementKey(t *testing.T) {
	for _, tc := range []struct {
		placement []int
		want      string
		ok        bool
	}{
		{[]int{1}, "1", true},
		{[]int{3, 1}, "13", true},
		{[]int{2, 0, 3, 1}, "123", true}, // zeros skipped; 231 → 123
		{[]int{1, 3, 2}, "132", true},    // a rotation, not a sort
		{[]int{4, 4, 1, 4}, "1444", true},
		{[]int{12}, "", false},
	} {
		got, ok := placementKey(tc.placement)
		if got != tc.want || ok != tc.ok {
			t.Errorf("placementKey(%v) = %q, %v; want %q, %v", tc.placement, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCurve(t *testing.T) {
	c := newCurve([]float64{64, 32, 128, 64}, []timing{{2, 1}, {1, 0.5}, {4, 1}, {4, 1}})
	for _, tc := range []struct {
		b    float64
		want timing
		ok   bool
	}{
		{32, timing{1, 0.5}, true},
		{48, timing{2, 0.75}, true},
		{64, timing{3, 1}, true}, // duplicates averaged
		{96, timing{3.5, 1}, true},
		{128, timing{4, 1}, true},
		{31, timing{}, false},
		{129, timing{}, false},
	} {
		got, ok := c.eval(tc.b)
		if ok != tc.ok || math.Abs(got.step-tc.want.step) > 1e-12 || math.Abs(got.sync-tc.want.sync) > 1e-12 {
			t.Errorf("eval(%v) = %v, %v; want %v, %v", tc.b, got, ok, tc.want, tc.ok)
		}
	}
}

// TestScatterReproducesLinearFunctions: linear interpolation on any
// triangulation is exact for a function linear in nodes, replicas and batch
// size, so every query inside the measured hull must return it exactly.
func TestScatterReproducesLinearFunctions(t *testing.T) {
	f := func(n, r, b float64) timing { return timing{0.5 + 0.03*n + 0.011*r + 0.002*b, 0.1 + 0.02*n + 0.005*r} }
	// The (nodes, replicas) groups of the traces: n ≤ 4 with n ≤ r ≤ 4n,
	// then a few replica counts at 6, 8, 12 and 16 nodes.
	var keys []point2
	for n := int64(1); n <= 4; n++ {
		for r := n; r <= 4*n; r++ {
			keys = append(keys, point2{n, r})
		}
	}
	for _, n := range []int64{6, 8, 12, 16} {
		for _, m := range []int64{1, 2, 3, 4} {
			keys = append(keys, point2{n, m * n})
		}
		keys = append(keys, point2{n, n + 1})
	}
	bsz := []float64{32, 45, 64, 91, 128}
	groups := make([]curve, len(keys))
	for i, k := range keys {
		var at []timing
		for _, b := range bsz {
			at = append(at, f(float64(k.x), float64(k.y), b))
		}
		groups[i] = newCurve(bsz, at)
	}
	s, err := newScatter(keys, groups)
	if err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= 16; n++ {
		for r := n; r <= 4*n; r++ {
			for _, b := range []float64{32, 40, 64, 100, 128} {
				got, err := s.eval(n, r, b)
				if err != nil {
					t.Fatalf("(%d, %d, %v): %v", n, r, b, err)
				}
				want := f(float64(n), float64(r), b)
				if math.Abs(got.step-want.step) > 1e-9 || math.Abs(got.sync-want.sync) > 1e-9 {
					t.Fatalf("(%d, %d, %v) = %v, want %v", n, r, b, got, want)
				}
			}
		}
	}
	for _, q := range [][2]int{{2, 1}, {3, 13}, {17, 20}} {
		if _, err := s.eval(q[0], q[1], 64); err == nil {
			t.Errorf("(%d nodes, %d replicas) is outside the measurements but interpolated", q[0], q[1])
		}
	}
	if _, err := s.eval(5, 10, 129); err == nil {
		t.Error("a batch size beyond the measurements was extrapolated")
	}
}

func TestTriangulationCoversHull(t *testing.T) {
	// Collinear points along the hull and cocircular lattice squares: the
	// triangles must tile the hull exactly (total area = hull area).
	var pts []point2
	for x := int64(0); x <= 6; x++ {
		for y := int64(0); y <= 4; y++ {
			pts = append(pts, point2{x, y})
		}
	}
	tr, err := newTriangulation(pts)
	if err != nil {
		t.Fatal(err)
	}
	area := int64(0)
	for _, tri := range tr.tris {
		a := orient(tr.pts[tri[0]], tr.pts[tri[1]], tr.pts[tri[2]])
		if a <= 0 {
			t.Fatalf("triangle %v is not counter-clockwise", tri)
		}
		area += a
	}
	if area != 2*6*4 {
		t.Fatalf("triangles cover %v, the hull is %v", float64(area)/2, 6*4)
	}
	if _, err := newTriangulation(pts[:2]); err == nil {
		t.Error("two points triangulated")
	}
}

// traceFiles builds a small, valid trace to which the cases below apply one
// fault each.
func traceFiles(placements, scalability string, validation map[int]string) TraceFiles {
	in := TraceFiles{Placements: strings.NewReader(placements), Scalability: strings.NewReader(scalability),
		Validation: map[int]io.Reader{}}
	for b, v := range validation {
		in.Validation[b] = strings.NewReader(v)
	}
	return in
}

const (
	goodPlacements = "placement,local_bsz,step_time,sync_time\n1,8,1.0,0\n1,16,1.8,0\n2,8,1.2,0.2\n2,16,2.0,0.2\n11,8,1.4,0.4\n11,16,2.2,0.4\n"
	goodScal       = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n6,6,8,2.0,1.0\n6,6,16,2.5,1.0\n6,24,8,3,2\n6,24,16,3.5,2\n"
	goodValidation = "progress,iteration,metric,grad_sqr,grad_var\n10,10,0.5,2,1\n20,20,0.6,1,1\n30,30,0.7,0.5,1\n"
)

func TestParseTrace(t *testing.T) {
	good := map[int]string{16: goodValidation, 32: goodValidation}
	tr, err := ParseTrace("m", ModelConfig{MaxEpochs: 2}, traceFiles(goodPlacements, goodScal, good))
	if err != nil {
		t.Fatal(err)
	}
	if tr.InitBatchSize != 16 || tr.MaxBatchSize != 32 || tr.MinLocalBatch != 8 || tr.MaxLocalBatch != 16 || tr.MaxEpochs != 2 || tr.ValidatedEpochs != 3 {
		t.Fatalf("parsed %+v", tr)
	}
	if step, sync, err := tr.StepTime([]int{1, 1}, 12); err != nil || math.Abs(step-1.8) > 1e-12 || math.Abs(sync-0.4) > 1e-12 {
		t.Fatalf("StepTime(11, 12) = %v, %v, %v; want 1.8, 0.4", step, sync, err)
	}
	if sqr, v, err := tr.GradStats(24, 1); err != nil || sqr != 1 || v != 1 {
		t.Fatalf("GradStats(24, 1) = %v, %v, %v", sqr, v, err)
	}
	// Epochs past the model's length but validated are there for a job
	// that trains longer (WorkloadJob.Epochs).
	if sqr, _, err := tr.GradStats(16, 2); err != nil || sqr != 0.5 || tr.Progress(3) != 30 {
		t.Fatalf("epoch 2: GradStats = %v, %v; Progress(3) = %v", sqr, err, tr.Progress(3))
	}
	if _, _, err := tr.GradStats(16, 3); err == nil {
		t.Fatal("GradStats of an epoch no trace records")
	}
	for _, tc := range []struct {
		name             string
		placements, scal string
		validation       map[int]string
		cfg              ModelConfig
		want             string
	}{
		{"missing column", "placement,local_bsz,step_time\n1,8,1\n", goodScal, good, ModelConfig{}, "no column"},
		{"not a number", strings.Replace(goodPlacements, "1.8", "fast", 1), goodScal, good, ModelConfig{}, "not a finite number"},
		{"NaN", strings.Replace(goodPlacements, "1.8", "NaN", 1), goodScal, good, ModelConfig{}, "not a finite number"},
		{"sync above step", strings.Replace(goodPlacements, "2,8,1.2,0.2", "2,8,1.2,1.3", 1), goodScal, good, ModelConfig{}, "sync"},
		{"bad placement", strings.Replace(goodPlacements, "\n11,", "\n1a,", 1), goodScal, good, ModelConfig{}, "GPU counts"},
		{"fractional batch", strings.Replace(goodPlacements, "1,16,1.8", "1,16.5,1.8", 1), goodScal, good, ModelConfig{}, "positive integer"},
		{"bad configuration", goodPlacements, strings.Replace(goodScal, "6,24,8", "6,5,8", 1), good, ModelConfig{}, "not a valid configuration"},
		{"no validation", goodPlacements, goodScal, nil, ModelConfig{}, "no validation"},
		{"too many epochs", goodPlacements, goodScal, good, ModelConfig{MaxEpochs: 4}, "only 3 rows"},
		{"progress falls", goodPlacements, goodScal, map[int]string{16: strings.Replace(goodValidation, "20,20", "5,20", 1)}, ModelConfig{}, "does not increase"},
		{"empty", "placement,local_bsz,step_time,sync_time\n", goodScal, good, ModelConfig{}, "no rows"},
		{"ragged", goodPlacements + "1,8\n", goodScal, good, ModelConfig{}, "wrong number of fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace("m", tc.cfg, traceFiles(tc.placements, tc.scal, tc.validation))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func FuzzParseTrace(f *testing.F) {
	f.Add(goodPlacements, goodScal, goodValidation)
	f.Add("placement,local_bsz,step_time,sync_time\n1111111111111111,1,1,0\n", goodScal, "progress,iteration,grad_sqr,grad_var\n1,1,0,0\n")
	f.Fuzz(func(t *testing.T, placements, scal, validation string) {
		tr, err := ParseTrace("m", ModelConfig{}, traceFiles(placements, scal, map[int]string{8: validation}))
		if err != nil {
			return
		}
		// What parses must answer without panicking.
		for _, p := range [][]int{{1}, {2, 2}, {4, 4, 4, 4, 4, 4}} {
			tr.StepTime(p, float64(tr.MinLocalBatch))
		}
		tr.GradStats(float64(tr.InitBatchSize), 0)
		tr.Progress(tr.MaxEpochs)
	})
}

func TestLoadTraces(t *testing.T) {
	traces := loadTestTraces(t)
	want := map[string][5]int{ // init batch, max batch, min local, max local, epochs
		"bert":        {12, 384, 4, 12, 2},
		"cifar10":     {128, 4096, 32, 1024, 100},
		"deepspeech2": {20, 640, 10, 80, 80},
		"imagenet":    {200, 12800, 20, 200, 90},
		"ncf":         {256, 32768, 32, 32768, 10},
		"yolov3":      {8, 512, 4, 8, 50},
	}
	for name, w := range want {
		tr := traces[name]
		if tr == nil {
			t.Fatalf("no trace for %s", name)
		}
		got := [5]int{tr.InitBatchSize, tr.MaxBatchSize, tr.MinLocalBatch, tr.MaxLocalBatch, tr.MaxEpochs}
		if got != w {
			t.Errorf("%s: %v, want %v", name, got, w)
		}
	}
	// Every configuration a 16 × 4 cluster can give a job at the local
	// batch sizes a job can run with has a step time.
	for name, tr := range traces {
		if name == "ncf" {
			continue // runs on one GPU (DefaultModels)
		}
		for r := 1; r <= 64; r++ {
			var packed []int
			for left := r; left > 0; left -= 4 {
				packed = append(packed, min(left, 4))
			}
			b := float64(min(tr.MaxLocalBatch, tr.MaxBatchSize/r))
			if b < float64(tr.MinLocalBatch) {
				continue
			}
			for _, p := range [][]int{packed} {
				if _, _, err := tr.StepTime(p, b); err != nil {
					t.Errorf("%s: %v at %v: %v", name, p, b, err)
				}
			}
		}
	}
	if _, err := LoadTraces(t.TempDir(), DefaultModels()); err == nil {
		t.Error("an empty directory loaded")
	}
}
