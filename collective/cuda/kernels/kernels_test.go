package kernels

import (
	"errors"
	"slices"
	"testing"

	"github.com/gorovod/gorovod/collective"
)

// TestPTXIsFromThisSource fails when kernels.cu changed but kernels.ptx was
// not regenerated: the GPU would run the old kernels.
func TestPTXIsFromThisSource(t *testing.T) {
	h, err := ParsePTXHeader(PTX)
	if err != nil {
		t.Fatal(err)
	}
	if h.SourceHash != SourceHash() {
		t.Fatalf("kernels.ptx was compiled from kernels.cu sha256=%s, but kernels.cu is now %s: run go generate ./collective/cuda/kernels (needs libnvrtc and nvrtc.h, see the package doc)", h.SourceHash, SourceHash())
	}
}

func TestPTXHasEveryKernel(t *testing.T) {
	entries := Entries(PTX)
	all := All()
	if len(all) != 38 {
		t.Errorf("%d kernels, want 28 reduce + 7 scale + 3 divide", len(all))
	}
	for _, k := range all {
		if !slices.Contains(entries, k.Name) {
			t.Errorf("kernels.ptx has no entry %s", k.Name)
		}
	}
	if len(entries) != len(all) {
		t.Errorf("kernels.ptx has %d entries, All lists %d", len(entries), len(all))
	}
}

func TestKernelNames(t *testing.T) {
	tests := []struct {
		name string
		get  func() (string, error)
		want string
	}{
		{"sum float32", func() (string, error) { return ReduceKernel(collective.Float32, collective.Sum) }, "gorovod_sum_float32"},
		{"product bfloat16", func() (string, error) { return ReduceKernel(collective.BFloat16, collective.Product) }, "gorovod_prod_bfloat16"},
		{"min uint8", func() (string, error) { return ReduceKernel(collective.Uint8, collective.Min) }, "gorovod_min_uint8"},
		{"max float16", func() (string, error) { return ReduceKernel(collective.Float16, collective.Max) }, "gorovod_max_float16"},
		{"average is not a kernel", func() (string, error) { return ReduceKernel(collective.Float32, collective.Average) }, ""},
		{"invalid dtype", func() (string, error) { return ReduceKernel(0, collective.Sum) }, ""},
		{"scale int64", func() (string, error) { return ScaleKernel(collective.Int64) }, "gorovod_scale_int64"},
		{"scale invalid", func() (string, error) { return ScaleKernel(99) }, ""},
		{"div int32", func() (string, error) { return DivKernel(collective.Int32) }, "gorovod_div_int32"},
		{"div float32", func() (string, error) { return DivKernel(collective.Float32) }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.get()
			if tc.want == "" {
				var ke *KernelError
				if !errors.As(err, &ke) {
					t.Fatalf("got %q, %v; want a *KernelError", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestGrid(t *testing.T) {
	tests := []struct{ n, want int }{
		{0, 1}, {1, 1}, {BlockThreads, 1}, {BlockThreads + 1, 2}, {maxBlocks * BlockThreads, maxBlocks}, {1 << 40, maxBlocks},
	}
	for _, tc := range tests {
		if got := Grid(tc.n); got != tc.want {
			t.Errorf("Grid(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestPTXHeader(t *testing.T) {
	tests := []struct {
		name    string
		ptx     string
		wantErr bool
	}{
		{"formatted", FormatPTX(".version 7.8\n", "11.8"), false},
		{"no header", ".version 7.8\n", true},
		{"header after code", ".version 7.8\n// source: kernels.cu sha256=ab\n// nvrtc: 1.0\n", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ParsePTXHeader(tc.ptx)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tc.wantErr)
			}
			if !tc.wantErr && (h.SourceHash != SourceHash() || h.NVRTC != "11.8") {
				t.Fatalf("header %+v", h)
			}
		})
	}
}
