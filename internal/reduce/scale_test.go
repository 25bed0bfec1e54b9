package reduce

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorovod/gorovod/internal/half"
)

type scaleFn[T any] func(dst, src []T, f float64)

var factors = []float64{
	0.5, 1.0 / 3, -2.5, 1e-3, 1.0 / 7, 65536, 0, math.Copysign(0, -1),
	3e38, 1e300, 1e-45, 1e-300, math.NaN(), math.Inf(1), math.Inf(-1),
}

// checkScale runs fast against ref for every factor, length, offset and
// dst == src.
func checkScale[T any](t *testing.T, k kind[T], fast, ref scaleFn[T]) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(len(k.name)), 11))
	for _, f := range factors {
		for _, n := range testLengths() {
			for off := 0; off < 8; off++ {
				if err := checkScaleOne(r, k, fast, ref, f, n, off); err != nil {
					t.Fatalf("%s scale by %v n=%d off=%d: %v", k.name, f, n, off, err)
				}
			}
		}
	}
}

func checkScaleOne[T any](r *rand.Rand, k kind[T], fast, ref scaleFn[T], f float64, n, off int) error {
	src := at((off+5)%8, randSlice(r, k, n+3))
	want := make([]T, n)
	ref(want, src, f)
	buf := randSlice(r, k, off+n+8)
	orig := append([]T(nil), buf...)
	fast(buf[off:off+n], src, f)
	// Prod stands for a multiply whose NaN payload may vary.
	if err := firstDiff(k, Prod, buf[off:off+n], want); err != nil {
		return err
	}
	for i := range buf {
		if (i < off || i >= off+n) && k.bits(buf[i]) != k.bits(orig[i]) {
			return fmt.Errorf("wrote outside dst at %d", i-off)
		}
	}
	in := at(off, src[:n])
	fast(in, in, f)
	if err := firstDiff(k, Prod, in, want); err != nil {
		return fmt.Errorf("dst == src: %w", err)
	}
	return nil
}

func TestScaleFloat32(t *testing.T) {
	checkScale(t, f32Kind, ScaleFloat32, func(dst, src []float32, f float64) {
		for i := range dst {
			dst[i] = src[i] * float32(f)
		}
	})
}

func TestScaleFloat64(t *testing.T) {
	checkScale(t, f64Kind, ScaleFloat64, func(dst, src []float64, f float64) {
		for i := range dst {
			dst[i] = src[i] * f
		}
	})
}

func TestScaleFloat16(t *testing.T) {
	checkScale(t, f16Kind, ScaleFloat16, func(dst, src []uint16, f float64) {
		for i := range dst {
			dst[i] = half.F32ToF16(half.F16ToF32(src[i]) * float32(f))
		}
	})
}

func TestScaleBFloat16(t *testing.T) {
	checkScale(t, bf16Kind, ScaleBFloat16, func(dst, src []uint16, f float64) {
		for i := range dst {
			dst[i] = half.F32ToBF16(half.BF16ToF32(src[i]) * float32(f))
		}
	})
}

func TestScaleFloat16Rounding(t *testing.T) {
	// 1 * (1 + 2^-11) is a tie between 1 and the next binary16; even wins.
	// 2049 * 1 ulp needs the rounding to happen after the multiply.
	src := []uint16{0x3c00, 0x3c01, 0x7bff, 0x0001}
	dst := make([]uint16, len(src))
	ScaleFloat16(dst, src, 1+0x1p-11)
	want := []uint16{0x3c00, 0x3c02, 0x7c00, 0x0001}
	for i := range want {
		if dst[i] != want[i] {
			t.Errorf("ScaleFloat16(%#04x) = %#04x, want %#04x", src[i], dst[i], want[i])
		}
	}
}

func TestScaleInt32(t *testing.T) {
	src := []int32{5, -5, 3, -3, math.MaxInt32, math.MinInt32, 1, 0}
	cases := []struct {
		f    float64
		want []int32
	}{
		{0.5, []int32{2, -2, 2, -2, 1 << 30, -1 << 30, 0, 0}},
		{3, []int32{15, -15, 9, -9, math.MaxInt32, math.MinInt32, 3, 0}},
		{math.NaN(), []int32{0, 0, 0, 0, 0, 0, 0, 0}},
		{math.Inf(1), []int32{math.MaxInt32, math.MinInt32, math.MaxInt32, math.MinInt32,
			math.MaxInt32, math.MinInt32, math.MaxInt32, 0}},
	}
	for _, c := range cases {
		dst := make([]int32, len(src))
		ScaleInt32(dst, src, c.f)
		for i := range src {
			if dst[i] != c.want[i] {
				t.Errorf("ScaleInt32(%d, %v) = %d, want %d", src[i], c.f, dst[i], c.want[i])
			}
		}
	}
}

func TestScaleInt64(t *testing.T) {
	src := []int64{math.MaxInt64, math.MinInt64, 5, -7, 1 << 53, 0}
	cases := []struct {
		f    float64
		want []int64
	}{
		{1, []int64{math.MaxInt64, math.MinInt64, 5, -7, 1 << 53, 0}},
		{0.5, []int64{1 << 62, -1 << 62, 2, -4, 1 << 52, 0}},
		{-1, []int64{math.MinInt64, math.MaxInt64, -5, 7, -1 << 53, 0}},
		{math.NaN(), []int64{0, 0, 0, 0, 0, 0}},
	}
	for _, c := range cases {
		dst := make([]int64, len(src))
		ScaleInt64(dst, src, c.f)
		for i := range src {
			if dst[i] != c.want[i] {
				t.Errorf("ScaleInt64(%d, %v) = %d, want %d", src[i], c.f, dst[i], c.want[i])
			}
		}
	}
}

func TestScaleUint8(t *testing.T) {
	src := []uint8{255, 3, 5, 200, 0, 1}
	cases := []struct {
		f    float64
		want []uint8
	}{
		{0.5, []uint8{128, 2, 2, 100, 0, 0}},
		{2, []uint8{255, 6, 10, 255, 0, 2}},
		{-1, []uint8{0, 0, 0, 0, 0, 0}},
		{math.NaN(), []uint8{0, 0, 0, 0, 0, 0}},
	}
	for _, c := range cases {
		dst := make([]uint8, len(src))
		ScaleUint8(dst, src, c.f)
		for i := range src {
			if dst[i] != c.want[i] {
				t.Errorf("ScaleUint8(%d, %v) = %d, want %d", src[i], c.f, dst[i], c.want[i])
			}
		}
	}
}

func TestDiv(t *testing.T) {
	i32 := []int32{7, -7, math.MinInt32, math.MaxInt32, 0, 1}
	DivInt32(i32, i32, 2)
	if want := []int32{3, -3, -1 << 30, 1<<30 - 1, 0, 0}; fmt.Sprint(i32) != fmt.Sprint(want) {
		t.Errorf("DivInt32 by 2 = %v, want %v", i32, want)
	}
	i32 = []int32{math.MinInt32, 9}
	DivInt32(i32, i32, -1)
	if i32[0] != math.MinInt32 || i32[1] != -9 {
		t.Errorf("DivInt32 by -1 = %v", i32)
	}
	i64 := []int64{math.MinInt64, -9, 9}
	DivInt64(i64, i64, -1)
	if i64[0] != math.MinInt64 || i64[1] != 9 || i64[2] != -9 {
		t.Errorf("DivInt64 by -1 = %v", i64)
	}
	DivInt64(i64, []int64{-9, 9, 1 << 40}, 1<<40)
	if fmt.Sprint(i64) != "[0 0 1]" {
		t.Errorf("DivInt64 by 2^40 = %v", i64)
	}
	u8 := []uint8{255, 7, 1}
	DivUint8(u8, u8, 2)
	if fmt.Sprint(u8) != "[127 3 0]" {
		t.Errorf("DivUint8 by 2 = %v", u8)
	}
}

// TestDivByZero checks that the division kernels reject a divisor of 0 with
// ErrDivideByZero and leave dst as it was.
func TestDivByZero(t *testing.T) {
	cases := []struct {
		name string
		run  func(n int) (untouched bool, err error)
	}{
		{"DivInt32", dividing(DivInt32, 7, 3)},
		{"DivInt64", dividing(DivInt64, 7, 3)},
		{"DivUint8", dividing(DivUint8, 7, 3)},
	}
	for _, c := range cases {
		for _, n := range []int{0, 1, 100} {
			untouched, err := c.run(n)
			if !errors.Is(err, ErrDivideByZero) {
				t.Errorf("%s by 0 of %d elements: error %v, want %v", c.name, n, err, ErrDivideByZero)
			}
			if !untouched {
				t.Errorf("%s by 0 of %d elements wrote to dst", c.name, n)
			}
		}
	}
}

// dividing runs div by 0 on n elements, dst filled with x and src with y,
// and reports whether dst still holds only x, and div's error.
func dividing[T comparable](div func(dst, src []T, d int64) error, x, y T) func(int) (bool, error) {
	return func(n int) (bool, error) {
		dst, src := make([]T, n), make([]T, n)
		for i := range dst {
			dst[i], src[i] = x, y
		}
		err := div(dst, src, 0)
		for _, v := range dst {
			if v != x {
				return false, err
			}
		}
		return true, err
	}
}
