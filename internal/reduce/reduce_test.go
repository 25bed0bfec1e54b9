package reduce

import (
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/internal/half"
)

func TestVectorKernelsActive(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("assembly kernels are amd64-only")
	}
	// Everything below compares the public (vector) path with the pure-Go
	// one; on a CPU without AVX2 that would compare Go with itself.
	if float32Vec(Sum, make([]float32, 64), make([]float32, 64), make([]float32, 64)) != 64 {
		t.Skip("CPU lacks AVX2: vector kernels not exercised")
	}
	if float16Vec(Sum, make([]uint16, 64), make([]uint16, 64), make([]uint16, 64)) != 64 {
		t.Error("AVX2 without F16C: float16 kernels not exercised")
	}
}

func TestFloat32(t *testing.T) { checkBinary(t, f32Kind, Float32, goKernel(float32Go), allOps...) }
func TestFloat64(t *testing.T) { checkBinary(t, f64Kind, Float64, goKernel(float64Go), allOps...) }
func TestInt32(t *testing.T)   { checkBinary(t, i32Kind, Int32, goKernel(intGo[int32]), allOps...) }
func TestInt64(t *testing.T)   { checkBinary(t, i64Kind, Int64, goKernel(intGo[int64]), allOps...) }
func TestUint8(t *testing.T)   { checkBinary(t, u8Kind, Uint8, goKernel(intGo[uint8]), allOps...) }

func TestFloat16(t *testing.T) {
	checkBinary(t, f16Kind, Float16, goKernel(float16Go), allOps...)
	checkBinary(t, f16Kind, Float16, viaFloat32(half.F16ToF32, half.F32ToF16), allOps...)
	checkBinary(t, f16Kind, goKernel(float16Go), viaFloat32(half.F16ToF32, half.F32ToF16), allOps...)
}

func TestBFloat16(t *testing.T) {
	checkBinary(t, bf16Kind, BFloat16, goKernel(bfloat16Go), allOps...)
	checkBinary(t, bf16Kind, BFloat16, viaFloat32(half.BF16ToF32, half.F32ToBF16), allOps...)
	checkBinary(t, bf16Kind, goKernel(bfloat16Go), viaFloat32(half.BF16ToF32, half.F32ToBF16), allOps...)
}

// viaFloat32 is the definition of the 16-bit kernels, written apart from
// the package's own code: widen, combine in float32, narrow once.
func viaFloat32(widen func(uint16) float32, narrow func(float32) uint16) binaryFn[uint16] {
	return func(op Op, dst, a, b []uint16) error {
		for i := range dst {
			x, y := widen(a[i]), widen(b[i])
			var z float32
			switch op {
			case Sum:
				z = x + y
			case Prod:
				z = x * y
			case Min:
				z = specMin(x, y)
			case Max:
				z = specMax(x, y)
			}
			dst[i] = narrow(z)
		}
		return nil
	}
}

// specMin and specMax restate the documented Min/Max semantics.
func specMin(x, y float32) float32 {
	if x != x || y != y || x == y {
		return math.Float32frombits(math.Float32bits(x) | math.Float32bits(y))
	}
	return min(x, y)
}

func specMax(x, y float32) float32 {
	switch {
	case x != x || y != y:
		return math.Float32frombits(math.Float32bits(x) | math.Float32bits(y))
	case x == y:
		return math.Float32frombits(math.Float32bits(x) & math.Float32bits(y))
	}
	return max(x, y)
}

func TestFloat32MatchesSpec(t *testing.T) {
	ref := func(op Op, dst, a, b []float32) error {
		for i := range dst {
			switch op {
			case Min:
				dst[i] = specMin(a[i], b[i])
			case Max:
				dst[i] = specMax(a[i], b[i])
			}
		}
		return nil
	}
	checkBinary(t, f32Kind, Float32, ref, Min, Max)
}

// TestMinMaxSymmetric checks that swapping the operands never changes the
// result bits, which ranks rely on to agree, and that NaNs propagate.
func TestMinMaxSymmetric(t *testing.T) {
	zero, negZero := float32(0), float32(math.Copysign(0, -1))
	nan1, nan2 := math.Float32frombits(0x7fc00001), math.Float32frombits(0xff800002)
	vals := []float32{zero, negZero, 1, -1, nan1, nan2, float32(math.Inf(1)), float32(math.Inf(-1))}
	var a, b []float32
	for _, x := range vals {
		for _, y := range vals {
			a, b = append(a, x), append(b, y)
		}
	}
	for _, op := range []Op{Min, Max} {
		ab, ba := make([]float32, len(a)), make([]float32, len(a))
		Float32(op, ab, a, b)
		Float32(op, ba, b, a)
		for i := range a {
			if math.Float32bits(ab[i]) != math.Float32bits(ba[i]) {
				t.Errorf("%v(%v, %v) = %#x but %v(%v, %v) = %#x", op, a[i], b[i],
					math.Float32bits(ab[i]), op, b[i], a[i], math.Float32bits(ba[i]))
			}
			if (a[i] != a[i] || b[i] != b[i]) != (ab[i] != ab[i]) {
				t.Errorf("%v(%v, %v) = %v: NaN not propagated exactly", op, a[i], b[i], ab[i])
			}
		}
	}
}

func TestSignedZeros(t *testing.T) {
	negZero := math.Copysign(0, -1)
	a := []float64{0, negZero, 0, negZero, 0, negZero, 0, negZero}
	b := []float64{negZero, 0, negZero, 0, negZero, 0, negZero, 0}
	for _, c := range []struct {
		op   Op
		sign bool
	}{{Min, true}, {Max, false}} {
		d64 := make([]float64, len(a))
		Float64(c.op, d64, a, b)
		a32, b32, d32 := make([]float32, len(a)), make([]float32, len(a)), make([]float32, len(a))
		for i := range a {
			a32[i], b32[i] = float32(a[i]), float32(b[i])
		}
		Float32(c.op, d32, a32, b32)
		for i := range a {
			if math.Signbit(d64[i]) != c.sign || math.Signbit(float64(d32[i])) != c.sign {
				t.Errorf("%v(%v, %v): got %v / %v", c.op, a[i], b[i], d64[i], d32[i])
			}
		}
	}
}

func TestIntegerWraps(t *testing.T) {
	a := []int32{math.MaxInt32, math.MinInt32, 1 << 20, 7, 0, 0, 0, 0, 3}
	b := []int32{1, -1, 1 << 12, -3, 0, 0, 0, 0, 5}
	dst := make([]int32, len(a))
	Int32(Sum, dst, a, b)
	if dst[0] != math.MinInt32 || dst[1] != math.MaxInt32 || dst[8] != 8 {
		t.Errorf("Int32 Sum = %v", dst)
	}
	Int32(Prod, dst, a, b)
	if dst[2] != 0 || dst[3] != -21 || dst[8] != 15 {
		t.Errorf("Int32 Prod = %v", dst)
	}
	u := make([]uint8, 40)
	Uint8(Sum, u, append(make([]uint8, 39), 200), append(make([]uint8, 39), 100))
	if u[39] != 44 {
		t.Errorf("Uint8 Sum wrapped to %d, want 44", u[39])
	}
}

// TestUnknownOp checks that every binary kernel rejects an op other than
// Sum, Prod, Min and Max with an error, before writing anything, at lengths
// that reach neither, one or both of the vector and Go paths.
func TestUnknownOp(t *testing.T) {
	// Each case fills dst with 7 and the sources with 3, which every known
	// op would change.
	kernels := []struct {
		name string
		run  func(op Op, n int) (untouched bool, err error)
	}{
		{"Float32", rejecting(Float32, 7, 3)},
		{"Float64", rejecting(Float64, 7, 3)},
		{"Float16", rejecting(Float16, 0x4700, 0x4200)},
		{"BFloat16", rejecting(BFloat16, 0x40e0, 0x4040)},
		{"Int32", rejecting(Int32, 7, 3)},
		{"Int64", rejecting(Int64, 7, 3)},
		{"Uint8", rejecting(Uint8, 7, 3)},
	}
	for _, k := range kernels {
		for _, op := range []Op{Max + 1, 17, 255} {
			for _, n := range []int{0, 1, 100, 4099} {
				untouched, err := k.run(op, n)
				want := "reduce: unknown op " + strconv.Itoa(int(op))
				if !errors.Is(err, ErrUnknownOp) || err.Error() != want {
					t.Errorf("%s(%v) of %d elements: error %v, want %q", k.name, op, n, err, want)
				}
				if !untouched {
					t.Errorf("%s(%v) of %d elements wrote to dst", k.name, op, n)
				}
			}
		}
	}
}

// rejecting runs kernel on n elements: dst filled with x, the sources with
// y. It reports whether dst still holds only x, and kernel's error.
func rejecting[T comparable](kernel func(Op, []T, []T, []T) error, x, y T) func(Op, int) (bool, error) {
	return func(op Op, n int) (bool, error) {
		dst, a, b := make([]T, n), make([]T, n), make([]T, n)
		for i := range dst {
			dst[i], a[i], b[i] = x, y, y
		}
		err := kernel(op, dst, a, b)
		for _, v := range dst {
			if v != x {
				return false, err
			}
		}
		return true, err
	}
}

func TestShortSourcePanics(t *testing.T) {
	if catch(func() { Float32(Sum, make([]float32, 10), make([]float32, 9), make([]float32, 10)) }) == "" {
		t.Error("short a did not panic")
	}
	if catch(func() { ScaleFloat16(make([]uint16, 10), make([]uint16, 9), 1) }) == "" {
		t.Error("short src did not panic")
	}
}

func catch(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = strings.TrimSpace(strings.ReplaceAll(toString(r), "\n", " "))
			if msg == "" {
				msg = "panic"
			}
		}
	}()
	f()
	return ""
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return "panic"
}

func TestOpString(t *testing.T) {
	if Sum.String() != "Sum" || Max.String() != "Max" || Op(200).String() != "Op(200)" {
		t.Error("Op.String")
	}
}

func TestNoAllocs(t *testing.T) {
	a := make([]float32, 1024)
	h := make([]uint16, 1024)
	if n := testing.AllocsPerRun(10, func() {
		Float32(Sum, a, a, a)
		Float16(Max, h, h, h)
		ScaleBFloat16(h, h, 0.5)
	}); n != 0 {
		t.Errorf("%v allocations per run", n)
	}
}
