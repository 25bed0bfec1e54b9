package reduce

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorovod/gorovod/internal/half"
)

// kind tells the test harness how to make and compare one element type.
type kind[T any] struct {
	name  string
	gen   func(r *rand.Rand) T
	bits  func(T) uint64
	isNaN func(T) bool
}

func never[T any](T) bool { return false }

var (
	f32Kind = kind[float32]{"float32", genF32,
		func(x float32) uint64 { return uint64(math.Float32bits(x)) },
		func(x float32) bool { return x != x }}
	f64Kind = kind[float64]{"float64", genF64, math.Float64bits,
		func(x float64) bool { return x != x }}
	f16Kind = kind[uint16]{"float16", genF16,
		func(x uint16) uint64 { return uint64(x) },
		func(x uint16) bool { return x&0x7c00 == 0x7c00 && x&0x3ff != 0 }}
	bf16Kind = kind[uint16]{"bfloat16", genBF16,
		func(x uint16) uint64 { return uint64(x) },
		func(x uint16) bool { return x&0x7f80 == 0x7f80 && x&0x7f != 0 }}
	i32Kind = kind[int32]{"int32", func(r *rand.Rand) int32 { return int32(genInt(r)) },
		func(x int32) uint64 { return uint64(x) }, never[int32]}
	i64Kind = kind[int64]{"int64", genInt,
		func(x int64) uint64 { return uint64(x) }, never[int64]}
	u8Kind = kind[uint8]{"uint8", func(r *rand.Rand) uint8 { return uint8(genInt(r)) },
		func(x uint8) uint64 { return uint64(x) }, never[uint8]}
)

// genF64 mixes ordinary magnitudes, small integers (exact sums and
// products), special values and raw bit patterns.
func genF64(r *rand.Rand) float64 {
	switch r.IntN(10) {
	case 0, 1, 2, 3:
		return (r.Float64()*2 - 1) * math.Ldexp(1, r.IntN(40)-20)
	case 4, 5:
		return float64(r.IntN(9) - 4)
	case 6, 7:
		return specials[r.IntN(len(specials))]
	}
	return math.Float64frombits(r.Uint64())
}

var specials = []float64{
	0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(),
	math.Float64frombits(0x7ff0000000000001),             // signalling NaN
	math.Float64frombits(0xfff8000000000123),             // negative NaN with payload
	float64(math.Float32frombits(0x7fa00001)),            // a float32 sNaN's payload
	math.SmallestNonzeroFloat64, -math.MaxFloat64, 1e-40, // 1e-40 is a float32 subnormal
	65504, 65520, 6e-8, 3e-5, -1e-7, 0x1p-14, // binary16 edges
}

func genF32(r *rand.Rand) float32 {
	if r.IntN(10) == 9 {
		return math.Float32frombits(r.Uint32())
	}
	f := genF64(r)
	if f != f {
		return math.Float32frombits(0x7f800000 | r.Uint32() | 1)
	}
	return float32(f)
}

func genF16(r *rand.Rand) uint16 {
	if r.IntN(3) == 0 {
		return uint16(r.Uint32())
	}
	return half.F32ToF16(genF32(r))
}

func genBF16(r *rand.Rand) uint16 {
	if r.IntN(3) == 0 {
		return uint16(r.Uint32())
	}
	return half.F32ToBF16(genF32(r))
}

func genInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return int64(r.IntN(9) - 4)
	case 1:
		return []int64{math.MinInt64, math.MaxInt64, math.MinInt32, math.MaxInt32, 255, 128, -1}[r.IntN(7)]
	}
	return int64(r.Uint64())
}

func randSlice[T any](r *rand.Rand, k kind[T], n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = k.gen(r)
	}
	return s
}

// at returns a copy of s starting off elements into a fresh buffer, so
// kernels see unaligned addresses.
func at[T any](off int, s []T) []T {
	buf := make([]T, off+len(s))
	copy(buf[off:], s)
	return buf[off:]
}

// testLengths covers every tail length up to a few unrolled iterations plus
// long buffers with odd remainders.
func testLengths() []int {
	var ns []int
	for n := 0; n <= 67; n++ {
		ns = append(ns, n)
	}
	return append(ns, 1000, 4099)
}

// sameResult reports whether got matches want bit for bit. NaN payloads
// of Sum and Prod (and Scale, passed as Prod) may differ when both inputs
// are NaNs: x86 keeps the first operand's, and Go's compiler may commute the
// operands, so only NaN-ness is held to.
func sameResult[T any](k kind[T], op Op, got, want T) bool {
	if k.bits(got) == k.bits(want) {
		return true
	}
	return (op == Sum || op == Prod) && k.isNaN(got) && k.isNaN(want)
}

func firstDiff[T any](k kind[T], op Op, got, want []T) error {
	for i := range want {
		if !sameResult(k, op, got[i], want[i]) {
			return fmt.Errorf("element %d: got %#x (%v), want %#x (%v)",
				i, k.bits(got[i]), got[i], k.bits(want[i]), want[i])
		}
	}
	return nil
}

// binaryFn is a binary kernel under test or a reference to hold it to.
type binaryFn[T any] func(op Op, dst, a, b []T) error

// goKernel makes a binaryFn of an unexported kernel, which has no error to
// return.
func goKernel[T any](f func(op Op, dst, a, b []T)) binaryFn[T] {
	return func(op Op, dst, a, b []T) error {
		f(op, dst, a, b)
		return nil
	}
}

// checkBinary runs fast against ref for every op, length, offset and
// aliasing, and checks that fast writes nothing outside dst.
func checkBinary[T any](t *testing.T, k kind[T], fast, ref binaryFn[T], ops ...Op) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(len(k.name)), 7))
	for _, op := range ops {
		for _, n := range testLengths() {
			for off := 0; off < 8; off++ {
				if err := checkOne(r, k, fast, ref, op, n, off); err != nil {
					t.Fatalf("%s %v n=%d off=%d: %v", k.name, op, n, off, err)
				}
			}
		}
	}
}

func checkOne[T any](r *rand.Rand, k kind[T], fast, ref binaryFn[T], op Op, n, off int) error {
	// Sources are longer than dst, and start at different offsets.
	a := at(off, randSlice(r, k, n+5))
	b := at((off+3)%8, randSlice(r, k, n+2))
	// Equal pairs exercise the ±0 and equal-NaN paths of Min and Max.
	for i := 0; i < n; i += 4 {
		b[i] = a[i]
	}
	want := make([]T, n)
	if err := ref(op, want, a, b); err != nil {
		return fmt.Errorf("reference: %w", err)
	}

	buf := randSlice(r, k, off+n+8)
	orig := append([]T(nil), buf...)
	if err := fast(op, buf[off:off+n], a, b); err != nil {
		return fmt.Errorf("separate dst: %w", err)
	}
	if err := firstDiff(k, op, buf[off:off+n], want); err != nil {
		return fmt.Errorf("separate dst: %w", err)
	}
	for i := range buf {
		if (i < off || i >= off+n) && k.bits(buf[i]) != k.bits(orig[i]) {
			return fmt.Errorf("wrote outside dst at %d", i-off)
		}
	}
	inA := at(off, a[:n])
	if err := fast(op, inA, inA, b); err != nil {
		return fmt.Errorf("dst == a: %w", err)
	}
	if err := firstDiff(k, op, inA, want); err != nil {
		return fmt.Errorf("dst == a: %w", err)
	}
	inB := at(off, b[:n])
	if err := fast(op, inB, a, inB); err != nil {
		return fmt.Errorf("dst == b: %w", err)
	}
	if err := firstDiff(k, op, inB, want); err != nil {
		return fmt.Errorf("dst == b: %w", err)
	}
	return nil
}

var allOps = []Op{Sum, Prod, Min, Max}
