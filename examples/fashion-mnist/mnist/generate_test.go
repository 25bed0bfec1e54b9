package mnist

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestGenerate(t *testing.T) {
	train, test, err := Generate(GenerateConfig{Train: 1000, Test: 200, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Set{train, test} {
		if s.Rows != 28 || s.Cols != 28 || len(s.Images) != s.N*784 || len(s.Labels) != s.N {
			t.Fatalf("set of %d: %d×%d, %d pixels, %d labels", s.N, s.Rows, s.Cols, len(s.Images), len(s.Labels))
		}
		var counts [Classes]int
		for _, l := range s.Labels {
			counts[l]++
		}
		for c, k := range counts {
			if k != s.N/Classes {
				t.Errorf("class %d has %d of %d samples", c, k, s.N)
			}
		}
		for _, p := range s.Images {
			if p < 0 || p > 1 {
				t.Fatalf("pixel %v outside [0, 1]", p)
			}
		}
	}
	if train.N != 1000 || test.N != 200 {
		t.Fatalf("sizes %d, %d", train.N, test.N)
	}
	again, _, _ := Generate(GenerateConfig{Train: 1000, Test: 200, Seed: 7})
	other, _, _ := Generate(GenerateConfig{Train: 1000, Test: 200, Seed: 8})
	if !slices.Equal(again.Images, train.Images) || !slices.Equal(again.Labels, train.Labels) {
		t.Error("the same seed gave another set")
	}
	if slices.Equal(other.Images, train.Images) {
		t.Error("another seed gave the same set")
	}
	if _, _, err := Generate(GenerateConfig{Train: 5, Test: 100}); err == nil {
		t.Error("a training set smaller than the classes was accepted")
	}
}

// TestGeneratedSetIsLearnable: the example's MLP learns the stand-in well
// above chance in two epochs, but not perfectly at once (it is not trivial:
// Fashion-MNIST itself gives this model about 85 % after one epoch).
func TestGeneratedSetIsLearnable(t *testing.T) {
	train, test, err := Generate(GenerateConfig{Train: 3000, Test: 1000, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := m.Evaluate(test, 1000)
	const batch = 64
	var x []float32
	var y []uint8
	var firstEpoch float64
	for epoch := range 2 {
		for lo := 0; lo+batch <= train.N; lo += batch {
			idx := make([]int, batch)
			for i := range idx {
				idx[i] = lo + i
			}
			x, y, err = train.Gather(idx, x, y)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.ComputeGradients(x, y, 1.0/batch); err != nil {
				t.Fatal(err)
			}
			m.Update(SGD{LR: 0.05, Momentum: 0.9})
		}
		r, _ := m.Evaluate(test, 1000)
		if epoch == 0 {
			firstEpoch = r.Accuracy()
		}
	}
	after, _ := m.Evaluate(test, 1000)
	t.Logf("test accuracy: %.3f before training, %.3f after one epoch, %.3f after two", before.Accuracy(), firstEpoch, after.Accuracy())
	if before.Accuracy() > 0.3 {
		t.Errorf("an untrained model scores %.3f", before.Accuracy())
	}
	if after.Accuracy() < 0.7 || firstEpoch > 0.97 {
		t.Errorf("after two epochs the model scores only %.3f", after.Accuracy())
	}
}

func TestLoadOrGenerate(t *testing.T) {
	fallback := filepath.Join(t.TempDir(), "fashion-mnist") // does not exist: the package is "not installed"
	gen := GenerateConfig{Train: 100, Test: 20}

	train, test, src, err := loadOrGenerate(fallback, fallback, gen)
	if err != nil || !src.Generated || train.N != 100 || test.N != 20 {
		t.Fatalf("fallback directory missing: %v, %+v", err, src)
	}
	if !errors.Is(src.Missing, fs.ErrNotExist) {
		t.Errorf("Missing %v", src.Missing)
	}
	w := src.Warning()
	for _, want := range []string{"WARNING", "GENERATED", fallback, "`apt-get install dataset-fashion-mnist`"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
	if !strings.Contains(src.String(), "GENERATED") {
		t.Errorf("String %q", src)
	}

	// Any other directory without the files is an error, not made-up data.
	typo := filepath.Join(t.TempDir(), "fashoin-mnist")
	_, _, src, err = loadOrGenerate(typo, fallback, gen)
	if !errors.Is(err, fs.ErrNotExist) || src.Generated || !strings.Contains(err.Error(), "apt-get install dataset-fashion-mnist") {
		t.Fatalf("mistyped directory: %v, %+v", err, src)
	}

	// A malformed file in the fallback directory is an error too: only a
	// missing data set is replaced.
	if err := os.MkdirAll(fallback, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{TrainImagesFile, TrainLabelsFile, TestImagesFile, TestLabelsFile} {
		os.WriteFile(filepath.Join(fallback, f), []byte("not gzip"), 0o644)
	}
	if _, _, src, err := loadOrGenerate(fallback, fallback, gen); !errors.Is(err, ErrFormat) || src.Generated {
		t.Fatalf("malformed data: %v, %+v", err, src)
	}

	// The public function falls back for the Debian directory only.
	if _, _, src, err := LoadOrGenerate(typo, gen); err == nil || src.Generated {
		t.Fatalf("LoadOrGenerate(%s): %v, %+v", typo, err, src)
	}
	if (Source{Dir: DefaultDir}).Warning() != "" {
		t.Error("a warning for the real data")
	}
}
