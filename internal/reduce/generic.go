package reduce

import (
	"math"

	"github.com/gorovod/gorovod/internal/half"
)

// This file holds the pure-Go kernels: the whole implementation on other
// architectures and older CPUs, the tail after the vector kernels, and the
// reference the tests hold the assembly to.

type integer interface{ ~int32 | ~int64 | ~uint8 }

type number interface{ integer | ~float32 | ~float64 }

// The binary kernels here and in the assembly are only ever given Sum,
// Prod, Min or Max: the exported functions reject any other op first.

func sumGo[T number](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func prodGo[T number](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

func intGo[T integer](op Op, dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case Sum:
		sumGo(dst, a, b)
	case Prod:
		prodGo(dst, a, b)
	case Min:
		for i := range dst {
			dst[i] = min(a[i], b[i])
		}
	case Max:
		for i := range dst {
			dst[i] = max(a[i], b[i])
		}
	}
}

func float32Go(op Op, dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case Sum:
		sumGo(dst, a, b)
	case Prod:
		prodGo(dst, a, b)
	case Min:
		for i := range dst {
			dst[i] = minF32(a[i], b[i])
		}
	case Max:
		for i := range dst {
			dst[i] = maxF32(a[i], b[i])
		}
	}
}

func float64Go(op Op, dst, a, b []float64) {
	a, b = a[:len(dst)], b[:len(dst)]
	switch op {
	case Sum:
		sumGo(dst, a, b)
	case Prod:
		prodGo(dst, a, b)
	case Min:
		for i := range dst {
			dst[i] = minF64(a[i], b[i])
		}
	case Max:
		for i := range dst {
			dst[i] = maxF64(a[i], b[i])
		}
	}
}

// minF32 is the symmetric minimum described in the package comment. Equal
// inputs can differ only as ±0, where the OR is -0; unordered ones OR into
// a NaN.
func minF32(x, y float32) float32 {
	switch {
	case x < y:
		return x
	case y < x:
		return y
	}
	return math.Float32frombits(math.Float32bits(x) | math.Float32bits(y))
}

// maxF32 is the symmetric maximum; the AND turns {+0,-0} into +0.
func maxF32(x, y float32) float32 {
	switch {
	case x > y:
		return x
	case y > x:
		return y
	case x == y:
		return math.Float32frombits(math.Float32bits(x) & math.Float32bits(y))
	}
	return math.Float32frombits(math.Float32bits(x) | math.Float32bits(y))
}

func minF64(x, y float64) float64 {
	switch {
	case x < y:
		return x
	case y < x:
		return y
	}
	return math.Float64frombits(math.Float64bits(x) | math.Float64bits(y))
}

func maxF64(x, y float64) float64 {
	switch {
	case x > y:
		return x
	case y > x:
		return y
	case x == y:
		return math.Float64frombits(math.Float64bits(x) & math.Float64bits(y))
	}
	return math.Float64frombits(math.Float64bits(x) | math.Float64bits(y))
}

// apply32 combines two widened 16-bit values; the op that is not Sum, Prod
// or Min is Max.
func apply32(op Op, x, y float32) float32 {
	switch op {
	case Sum:
		return x + y
	case Prod:
		return x * y
	case Min:
		return minF32(x, y)
	}
	return maxF32(x, y)
}

func float16Go(op Op, dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = half.F32ToF16(apply32(op, half.F16ToF32(a[i]), half.F16ToF32(b[i])))
	}
}

func bfloat16Go(op Op, dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = half.F32ToBF16(apply32(op, half.BF16ToF32(a[i]), half.BF16ToF32(b[i])))
	}
}

func scaleFloatGo[T ~float32 | ~float64](dst, src []T, f T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] * f
	}
}

func scaleFloat16Go(dst, src []uint16, f float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = half.F32ToF16(half.F16ToF32(src[i]) * f)
	}
}

func scaleBFloat16Go(dst, src []uint16, f float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = half.F32ToBF16(half.BF16ToF32(src[i]) * f)
	}
}

func toInt32(v float64) int32 {
	v = math.RoundToEven(v)
	switch {
	case v >= math.MaxInt32:
		return math.MaxInt32
	case v <= math.MinInt32:
		return math.MinInt32
	case v != v:
		return 0
	}
	return int32(v)
}

func toInt64(v float64) int64 {
	v = math.RoundToEven(v)
	switch {
	case v >= 0x1p63: // MaxInt64 itself is not a float64
		return math.MaxInt64
	case v <= math.MinInt64:
		return math.MinInt64
	case v != v:
		return 0
	}
	return int64(v)
}

func toUint8(v float64) uint8 {
	v = math.RoundToEven(v)
	switch {
	case v >= math.MaxUint8:
		return math.MaxUint8
	case v > 0:
		return uint8(v)
	}
	return 0 // negative, zero or NaN
}
