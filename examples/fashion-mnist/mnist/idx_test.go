package mnist_test

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/examples/fashion-mnist/mnist"
)

// idx builds an IDX file: magic 0x0000 08 <ndims>, dims, payload.
func idx(dims []uint32, payload []byte) []byte {
	b := []byte{0, 0, 0x08, byte(len(dims))}
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, payload...)
}

func gz(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeImages(t *testing.T) {
	px, n, rows, cols, err := mnist.DecodeImages(bytes.NewReader(idx([]uint32{2, 1, 3}, []byte{0, 51, 255, 102, 0, 204})))
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || rows != 1 || cols != 3 {
		t.Fatalf("dims %d×%d×%d, want 2×1×3", n, rows, cols)
	}
	if want := []float32{0, 0.2, 1, 0.4, 0, 0.8}; !slices.Equal(px, want) {
		t.Fatalf("pixels %v, want %v", px, want)
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name   string
		labels bool
		b      []byte
		want   string
	}{
		{"empty", false, nil, "magic"},
		{"labels magic for images", false, idx([]uint32{1}, []byte{0}), "magic"},
		{"images magic for labels", true, idx([]uint32{1, 1, 1}, []byte{0}), "magic"},
		{"float type", false, []byte{0, 0, 0x0d, 3}, "magic"},
		{"nonzero lead byte", true, []byte{1, 0, 0x08, 1, 0, 0, 0, 1, 0}, "magic"},
		{"short header", false, []byte{0, 0, 8, 3, 0, 0}, "dimension 0"},
		{"zero dimension", false, idx([]uint32{0, 28, 28}, nil), "zero"},
		{"huge dimensions", false, idx([]uint32{1 << 31, 1 << 31, 2}, nil), "exceed"},
		{"truncated payload", false, idx([]uint32{2, 2, 2}, []byte{1, 2, 3}), "announce"},
		{"trailing bytes", true, idx([]uint32{2}, []byte{1, 2, 3}), "continues"},
		{"label out of range", true, idx([]uint32{3}, []byte{1, 10, 3}), "label 10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.labels {
				_, err = mnist.DecodeLabels(bytes.NewReader(tc.b))
			} else {
				_, _, _, _, err = mnist.DecodeImages(bytes.NewReader(tc.b))
			}
			if !errors.Is(err, mnist.ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrFormat mentioning %q", err, tc.want)
			}
		})
	}
}

// writeDataDir writes a tiny data set in the Debian package's layout.
func writeDataDir(t *testing.T, trainN, testN int) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, dims []uint32, payload []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), gz(t, idx(dims, payload)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct {
		images, labels string
		n              int
	}{{mnist.TrainImagesFile, mnist.TrainLabelsFile, trainN}, {mnist.TestImagesFile, mnist.TestLabelsFile, testN}} {
		px := make([]byte, s.n*4)
		lb := make([]byte, s.n)
		for i := range s.n {
			lb[i] = byte(i % mnist.Classes)
			px[i*4] = byte(i) // the first pixel identifies the sample
		}
		write(s.images, []uint32{uint32(s.n), 2, 2}, px)
		write(s.labels, []uint32{uint32(s.n)}, lb)
	}
	return dir
}

func TestLoad(t *testing.T) {
	dir := writeDataDir(t, 12, 5)
	train, test, err := mnist.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 12 || test.N != 5 || train.Features() != 4 {
		t.Fatalf("loaded %d/%d samples of %d features, want 12/5 of 4", train.N, test.N, train.Features())
	}
	x, y, err := train.Gather([]int{11, 0, 3}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if x[0] != 11/255.0 || x[4] != 0 || x[8] != 3/255.0 || !slices.Equal(y, []uint8{1, 0, 3}) {
		t.Fatalf("Gather: x %v y %v", x, y)
	}
	if _, _, err := train.Gather([]int{12}, x, y); err == nil {
		t.Fatal("Gather out of range succeeded")
	}
	for _, tc := range []struct{ lo, hi, n, first int }{{0, 3, 3, 0}, {10, 20, 2, 10}, {5, 2, 0, -1}, {-4, 1, 1, 0}} {
		sl := train.Slice(tc.lo, tc.hi)
		if sl.N != tc.n || len(sl.Images) != 4*tc.n || len(sl.Labels) != tc.n {
			t.Fatalf("Slice(%d, %d) = %d samples, %d floats, %d labels; want %d", tc.lo, tc.hi, sl.N, len(sl.Images), len(sl.Labels), tc.n)
		}
		if tc.n > 0 && sl.Images[0] != float32(tc.first)/255 {
			t.Fatalf("Slice(%d, %d) starts with sample %g, want %d", tc.lo, tc.hi, sl.Images[0]*255, tc.first)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	t.Run("missing directory names the Debian package", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "nope")
		_, _, err := mnist.Load(dir)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("error %v does not match fs.ErrNotExist", err)
		}
		for _, want := range []string{mnist.DebianPackage, filepath.Join(dir, mnist.TrainImagesFile)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	})
	t.Run("not gzip", func(t *testing.T) {
		dir := writeDataDir(t, 3, 3)
		if err := os.WriteFile(filepath.Join(dir, mnist.TestLabelsFile), []byte("plain"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := mnist.Load(dir); !errors.Is(err, mnist.ErrFormat) {
			t.Fatalf("error %v, want ErrFormat", err)
		}
	})
	t.Run("label count differs", func(t *testing.T) {
		dir := writeDataDir(t, 3, 3)
		if err := os.WriteFile(filepath.Join(dir, mnist.TrainLabelsFile), gz(t, idx([]uint32{2}, []byte{0, 1})), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := mnist.Load(dir); !errors.Is(err, mnist.ErrFormat) || !strings.Contains(err.Error(), "2 labels") {
			t.Fatalf("error %v, want ErrFormat about 2 labels", err)
		}
	})
	t.Run("corrupt gzip checksum", func(t *testing.T) {
		dir := writeDataDir(t, 3, 3)
		p := filepath.Join(dir, mnist.TrainLabelsFile)
		b, _ := os.ReadFile(p)
		b[len(b)-8] ^= 0xff // CRC-32 in the gzip trailer
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := mnist.Load(dir); !errors.Is(err, mnist.ErrFormat) {
			t.Fatalf("error %v, want ErrFormat", err)
		}
	})
}

// realTestSet loads the installed data set's test half (10k images), or skips
// the test. Unit tests use only this half: decompressing the 26 MB training
// file takes ~10 s under the race detector, which instruments compress/flate.
func realTestSet(t *testing.T) *mnist.Set {
	t.Helper()
	dir := mnist.DefaultDir
	s, err := mnist.LoadSet(filepath.Join(dir, mnist.TestImagesFile), filepath.Join(dir, mnist.TestLabelsFile))
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("Fashion-MNIST not installed (apt-get install %s): %v", mnist.DebianPackage, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRealDataSet(t *testing.T) {
	s := realTestSet(t)
	if s.N != 10000 || s.Rows != 28 || s.Cols != 28 {
		t.Fatalf("%d images of %d×%d, want 10000 of 28×28", s.N, s.Rows, s.Cols)
	}
	var counts [mnist.Classes]int
	for _, l := range s.Labels {
		counts[l]++
	}
	for c, k := range counts {
		if k != 1000 {
			t.Errorf("class %d has %d test samples, want 1000", c, k)
		}
	}
	var lo, hi float32 = 1, 0
	for _, p := range s.Images {
		lo, hi = min(lo, p), max(hi, p)
	}
	if lo != 0 || hi != 1 {
		t.Errorf("pixels span [%g, %g], want [0, 1]", lo, hi)
	}
}
