package kernels

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/reduce"
)

// The host check: kernels.cu compiled as C++ by the host compiler, with a shim
// that makes each __global__ kernel a plain function run by a single "thread"
// (so its grid-stride loop visits every element), driven over a pipe and
// compared with internal/reduce. It checks the kernels' arithmetic, the
// 16-bit conversions and the saturating integer paths on this machine, with
// no GPU; UndefinedBehaviorSanitizer also checks that no kernel relies on
// signed overflow or out-of-range float-to-integer conversions, which the C++
// standard leaves undefined on the GPU too.

const hostPrelude = `#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
struct gorovod_dim3 { unsigned int x, y, z; };
static const gorovod_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const gorovod_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#include "kernels.cu"

static bool get(void *p, size_t n) { return n == 0 || fread(p, 1, n, stdin) == n; }

// Request: u32 name length, name, u64 n, u64 element size, f64 factor,
// i64 divisor, a (n elements), b (n elements). Response: dst (n elements).
// Scale and divide kernels work in place on a copy of a.
int main() {
    for (;;) {
        unsigned int len;
        if (!get(&len, 4)) return 0;
        std::string name(len, '\0');
        u64 n, size;
        double f;
        i64 d;
        if (!get(&name[0], len) || !get(&n, 8) || !get(&size, 8) || !get(&f, 8) || !get(&d, 8)) return 3;
        std::vector<unsigned char> a(n * size + 1), b(n * size + 1), dst(n * size + 1);
        if (!get(a.data(), n * size) || !get(b.data(), n * size)) return 3;
        memcpy(dst.data(), a.data(), n * size);
        void *x = dst.data();
        const void *pa = a.data(), *pb = b.data();
        (void)pa; (void)pb; (void)f; (void)d; (void)x;
        if (false) {
        }
`

const hostPostlude = `        else {
            fprintf(stderr, "unknown kernel %s\n", name.c_str());
            return 2;
        }
        if (fwrite(dst.data(), 1, n * size, stdout) != n * size) return 4;
        fflush(stdout);
    }
}
`

func cType(dt collective.DType) string {
	switch dt {
	case collective.Float32:
		return "float"
	case collective.Float64:
		return "double"
	case collective.Float16, collective.BFloat16:
		return "u16"
	case collective.Int32:
		return "i32"
	case collective.Int64:
		return "i64"
	}
	return "u8"
}

func hostDriver() string {
	var b strings.Builder
	b.WriteString(hostPrelude)
	for _, k := range All() {
		t := cType(k.DType)
		fmt.Fprintf(&b, "        else if (name == %q) ", k.Name)
		switch k.Kind {
		case Reduce:
			fmt.Fprintf(&b, "%s((%s *)x, (const %s *)pa, (const %s *)pb, n);\n", k.Name, t, t, t)
		case Scale:
			fmt.Fprintf(&b, "%s((%s *)x, n, f);\n", k.Name, t)
		case Div:
			fmt.Fprintf(&b, "%s((%s *)x, n, d);\n", k.Name, t)
		}
	}
	b.WriteString(hostPostlude)
	return b.String()
}

// hostKernels is the running driver.
type hostKernels struct {
	cmd *exec.Cmd
	in  *bufio.Writer
	out *bufio.Reader
}

func startHostKernels(t *testing.T) *hostKernels {
	t.Helper()
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		t.Skipf("no C++ compiler (%s) to run kernels.cu on the host: %v", cxx, err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "driver.cc")
	if err := os.WriteFile(src, []byte(hostDriver()), 0o644); err != nil {
		t.Fatal(err)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "driver")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// -O2 lets the optimizer exploit any undefined behaviour, as the GPU
	// compiler may; no contraction or fast math, as with the NVRTC Options.
	args := []string{"-std=c++14", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-fno-fast-math",
		"-I", here, "-o", bin, src}
	sanitize := []string{"-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all"}
	out, err := exec.CommandContext(ctx, cxx, append(sanitize, args...)...).CombinedOutput()
	if err != nil {
		// A compiler without the sanitizer runtime still checks the arithmetic.
		t.Logf("%s with UBSan failed (%v), retrying without: %s", cxx, err, out)
		if out, err = exec.CommandContext(ctx, cxx, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cxx, err, out)
		}
	}
	cmd := exec.Command(bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("host kernel driver: %v\n%s", err, stderr.String())
		}
	})
	return &hostKernels{cmd: cmd, in: bufio.NewWriter(stdin), out: bufio.NewReader(stdout)}
}

// run runs kernel name on a and b (byte images of n elements of size bytes).
func (h *hostKernels) run(name string, size int, a, b []byte, f float64, d int64) ([]byte, error) {
	n := len(a) / size
	var hdr []byte
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(name)))
	hdr = append(hdr, name...)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(n))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(size))
	hdr = binary.LittleEndian.AppendUint64(hdr, math.Float64bits(f))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(d))
	h.in.Write(hdr)
	h.in.Write(a)
	h.in.Write(b)
	if err := h.in.Flush(); err != nil {
		return nil, err
	}
	out := make([]byte, len(a))
	_, err := io.ReadFull(h.out, out)
	return out, err
}

func view[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

func kernelOp(op collective.ReduceOp) reduce.Op {
	switch op {
	case collective.Product:
		return reduce.Prod
	case collective.Min:
		return reduce.Min
	case collective.Max:
		return reduce.Max
	}
	return reduce.Sum
}

// hostReference is what internal/reduce computes for kernel k.
func hostReference(k Kernel, a, b []byte, f float64, d int64) []byte {
	dst := make([]byte, len(a))
	switch k.Kind {
	case Reduce:
		op := kernelOp(k.Op)
		switch k.DType {
		case collective.Float32:
			reduce.Float32(op, view[float32](dst), view[float32](a), view[float32](b))
		case collective.Float64:
			reduce.Float64(op, view[float64](dst), view[float64](a), view[float64](b))
		case collective.Float16:
			reduce.Float16(op, view[uint16](dst), view[uint16](a), view[uint16](b))
		case collective.BFloat16:
			reduce.BFloat16(op, view[uint16](dst), view[uint16](a), view[uint16](b))
		case collective.Int32:
			reduce.Int32(op, view[int32](dst), view[int32](a), view[int32](b))
		case collective.Int64:
			reduce.Int64(op, view[int64](dst), view[int64](a), view[int64](b))
		case collective.Uint8:
			reduce.Uint8(op, dst, a, b)
		}
	case Scale:
		switch k.DType {
		case collective.Float32:
			reduce.ScaleFloat32(view[float32](dst), view[float32](a), f)
		case collective.Float64:
			reduce.ScaleFloat64(view[float64](dst), view[float64](a), f)
		case collective.Float16:
			reduce.ScaleFloat16(view[uint16](dst), view[uint16](a), f)
		case collective.BFloat16:
			reduce.ScaleBFloat16(view[uint16](dst), view[uint16](a), f)
		case collective.Int32:
			reduce.ScaleInt32(view[int32](dst), view[int32](a), f)
		case collective.Int64:
			reduce.ScaleInt64(view[int64](dst), view[int64](a), f)
		case collective.Uint8:
			reduce.ScaleUint8(dst, a, f)
		}
	case Div:
		switch k.DType {
		case collective.Int32:
			reduce.DivInt32(view[int32](dst), view[int32](a), d)
		case collective.Int64:
			reduce.DivInt64(view[int64](dst), view[int64](a), d)
		case collective.Uint8:
			reduce.DivUint8(dst, a, d)
		}
	}
	return dst
}

// isNaN reports whether element i of b (of dt) is a NaN.
func isNaN(dt collective.DType, b []byte, i int) bool {
	switch dt {
	case collective.Float32:
		v := binary.LittleEndian.Uint32(b[4*i:])
		return v&0x7fffffff > 0x7f800000
	case collective.Float64:
		v := binary.LittleEndian.Uint64(b[8*i:])
		return v&(1<<63-1) > 0x7ff0000000000000
	case collective.Float16:
		return binary.LittleEndian.Uint16(b[2*i:])&0x7fff > 0x7c00
	case collective.BFloat16:
		return binary.LittleEndian.Uint16(b[2*i:])&0x7fff > 0x7f80
	}
	return false
}

// sameResult compares element by element. NaN payloads may differ only where
// the package doc says they may: Sum, Product and Scale.
func sameResult(k Kernel, got, want []byte) error {
	size := k.DType.Size()
	payloadFree := k.Kind == Scale || k.Op == collective.Sum || k.Op == collective.Product
	for i := 0; i < len(want)/size; i++ {
		g, w := got[i*size:(i+1)*size], want[i*size:(i+1)*size]
		if bytes.Equal(g, w) {
			continue
		}
		if payloadFree && isNaN(k.DType, got, i) && isNaN(k.DType, want, i) {
			continue
		}
		return fmt.Errorf("element %d: got % x, want % x", i, g, w)
	}
	return nil
}

// specials are the edge values of each type, as bit patterns or values.
func specials(dt collective.DType) []byte {
	var b []byte
	switch dt {
	case collective.Float32:
		for _, v := range []uint32{0, 0x80000000, 1, 0x80000001, 0x007fffff, 0x00800000, 0x3f800000, 0xbf800000,
			0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa00000,
			0x33800000, 0x38800000, 0x477fe000, 0x477ff000, 0x3f000000, 0x40490fdb} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
	case collective.Float64:
		for _, v := range []uint64{0, 1 << 63, 1, 1<<63 | 1, 0x000fffffffffffff, 0x0010000000000000, 0x3ff0000000000000,
			0xbff0000000000000, 0x7fefffffffffffff, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
			0xfff8000000000001, 0x7ff0000000000001, 0x3fe0000000000000, 0x400921fb54442d18} {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	case collective.Float16:
		for _, v := range []uint16{0, 0x8000, 1, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0xfbff,
			0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01, 0x7d00, 0x3800, 0x4248, 0x3555} {
			b = binary.LittleEndian.AppendUint16(b, v)
		}
	case collective.BFloat16:
		for _, v := range []uint16{0, 0x8000, 1, 0x8001, 0x007f, 0x0080, 0x3f80, 0xbf80, 0x7f7f, 0xff7f,
			0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0x7fa0, 0x3f00, 0x4049, 0x3eab} {
			b = binary.LittleEndian.AppendUint16(b, v)
		}
	case collective.Int32:
		for _, v := range []int32{0, 1, -1, 2, -2, 3, 7, -7, 100, math.MaxInt32, math.MinInt32, math.MaxInt32 - 1, math.MinInt32 + 1, 1 << 30, 46341} {
			b = binary.LittleEndian.AppendUint32(b, uint32(v))
		}
	case collective.Int64:
		for _, v := range []int64{0, 1, -1, 2, -2, 3, 7, -7, 100, math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, math.MinInt64 + 1,
			1 << 53, 1<<53 + 1, -(1<<53 + 1), 1 << 62, 3037000500} {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	case collective.Uint8:
		b = []byte{0, 1, 2, 3, 7, 15, 16, 127, 128, 129, 200, 254, 255}
	}
	return b
}

// randomElems returns n elements of dt: random bit patterns (every class of
// value, NaNs included) and, for floats, half of them ordinary magnitudes.
func randomElems(rng *rand.Rand, dt collective.DType, n int) []byte {
	size := dt.Size()
	b := make([]byte, n*size)
	for i := range n {
		e := b[i*size : (i+1)*size]
		for j := range e {
			e[j] = byte(rng.Uint32())
		}
		if i%2 == 1 && dt.IsFloat() {
			v := (rng.Float64()*2 - 1) * math.Pow(2, float64(rng.IntN(20)-10))
			switch dt {
			case collective.Float32:
				binary.LittleEndian.PutUint32(e, math.Float32bits(float32(v)))
			case collective.Float64:
				binary.LittleEndian.PutUint64(e, math.Float64bits(v))
			case collective.Float16:
				binary.LittleEndian.PutUint16(e, uint16(collective.NewF16(float32(v))))
			case collective.BFloat16:
				binary.LittleEndian.PutUint16(e, uint16(collective.NewBF16(float32(v))))
			}
		}
	}
	return b
}

// pairs returns a and b covering every pair of specials, then n random pairs.
func pairs(rng *rand.Rand, dt collective.DType, n int) (a, b []byte) {
	sp := specials(dt)
	size := dt.Size()
	for i := 0; i < len(sp); i += size {
		for j := 0; j < len(sp); j += size {
			a = append(a, sp[i:i+size]...)
			b = append(b, sp[j:j+size]...)
		}
	}
	return append(a, randomElems(rng, dt, n)...), append(b, randomElems(rng, dt, n)...)
}

// every16 is all 65536 bit patterns of a 16-bit type: the scale kernels of
// float16 and bfloat16 are checked exhaustively.
func every16() []byte {
	b := make([]byte, 0, 2<<16)
	for v := range 1 << 16 {
		b = binary.LittleEndian.AppendUint16(b, uint16(v))
	}
	return b
}

func TestKernelsMatchHostReduce(t *testing.T) {
	h := startHostKernels(t)
	rng := rand.New(rand.NewPCG(1, 2))
	factors := []float64{2, 0.5, -1, 1.0 / 3, 0.1, 1.5, 2.5, -2.5, 1e-3, 1e10, 1e300, -1e300, 0, math.Copysign(0, -1),
		math.Inf(1), math.Inf(-1), math.NaN(), 1 << 40}
	divisors := []int64{2, 3, 7, 8, 255, 256, -1, -3, 1 << 40, math.MaxInt64}
	for _, k := range All() {
		t.Run(k.Name, func(t *testing.T) {
			switch k.Kind {
			case Reduce:
				a, b := pairs(rng, k.DType, 4096)
				check(t, h, k, a, b, 0, 0)
			case Scale:
				a := append(specials(k.DType), randomElems(rng, k.DType, 4096)...)
				if k.DType.Size() == 2 {
					a = every16()
				}
				for _, f := range factors {
					check(t, h, k, a, a, f, 0)
				}
			case Div:
				a := append(specials(k.DType), randomElems(rng, k.DType, 4096)...)
				for _, d := range divisors {
					check(t, h, k, a, a, 1, d)
				}
			}
		})
	}
}

func check(t *testing.T, h *hostKernels, k Kernel, a, b []byte, f float64, d int64) {
	t.Helper()
	got, err := h.run(k.Name, k.DType.Size(), a, b, f, d)
	if err != nil {
		t.Fatalf("host kernel driver: %v", err)
	}
	want := hostReference(k, a, b, f, d)
	if err := sameResult(k, got, want); err != nil {
		size := k.DType.Size()
		var i int
		fmt.Sscanf(err.Error(), "element %d", &i)
		switch k.Kind {
		case Scale:
			t.Fatalf("factor %v: %v (input % x)", f, err, a[i*size:(i+1)*size])
		case Div:
			t.Fatalf("divisor %d: %v (input % x)", d, err, a[i*size:(i+1)*size])
		}
		t.Fatalf("%v (inputs % x and % x)", err, a[i*size:(i+1)*size], b[i*size:(i+1)*size])
	}
}
