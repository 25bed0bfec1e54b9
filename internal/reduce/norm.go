package reduce

import "github.com/gorovod/gorovod/internal/half"

// The norm kernels reduce floating-point buffers to float64 sums of
// products: SumSquares* return Σ x[i]², Dot* return Σ x[i]·y[i] (the
// gradient noise measurement's squared norms and inner products). Every
// element is widened to float64 before it is multiplied, so the products of
// float32, float16 and bfloat16 elements are exact; the sums go through
// sixteen interleaved lanes (element i into lane i mod 16, each lane in
// order) that are then added lane by lane, and the elements after the last
// whole group of sixteen one by one. The assembly and the pure-Go kernels
// follow that same order, so the result has the same bits on every CPU.
// NaNs and infinities propagate.

// normLanes is the number of interleaved partial sums.
const normLanes = 16

type lanes = [normLanes]float64

// finish adds the lanes in order.
func finish(acc *lanes) float64 {
	var s float64
	for _, v := range acc {
		s += v
	}
	return s
}

// SumSquaresFloat32 returns Σ x[i]².
func SumSquaresFloat32(x []float32) float64 {
	var acc lanes
	k := sumsqFloat32Vec(&acc, x)
	return sumsqTail(&acc, x, k, widen32)
}

// SumSquaresFloat64 returns Σ x[i]².
func SumSquaresFloat64(x []float64) float64 {
	var acc lanes
	k := sumsqFloat64Vec(&acc, x)
	return sumsqTail(&acc, x, k, widen64)
}

// SumSquaresFloat16 returns Σ x[i]² of IEEE binary16 elements given as raw
// bits.
func SumSquaresFloat16(x []uint16) float64 {
	var acc lanes
	k := sumsqFloat16Vec(&acc, x)
	return sumsqTail(&acc, x, k, widenF16)
}

// SumSquaresBFloat16 returns Σ x[i]² of bfloat16 elements given as raw
// bits.
func SumSquaresBFloat16(x []uint16) float64 {
	var acc lanes
	k := sumsqBFloat16Vec(&acc, x)
	return sumsqTail(&acc, x, k, widenBF16)
}

// DotFloat32 returns Σ x[i]·y[i] over i < len(x); y must be at least as
// long as x.
func DotFloat32(x, y []float32) float64 {
	y = y[:len(x)]
	var acc lanes
	k := dotFloat32Vec(&acc, x, y)
	return dotTail(&acc, x, y, k, widen32)
}

// DotFloat64 returns Σ x[i]·y[i] over i < len(x).
func DotFloat64(x, y []float64) float64 {
	y = y[:len(x)]
	var acc lanes
	k := dotFloat64Vec(&acc, x, y)
	return dotTail(&acc, x, y, k, widen64)
}

// DotFloat16 returns Σ x[i]·y[i] of binary16 bits over i < len(x).
func DotFloat16(x, y []uint16) float64 {
	y = y[:len(x)]
	var acc lanes
	k := dotFloat16Vec(&acc, x, y)
	return dotTail(&acc, x, y, k, widenF16)
}

// DotBFloat16 returns Σ x[i]·y[i] of bfloat16 bits over i < len(x).
func DotBFloat16(x, y []uint16) float64 {
	y = y[:len(x)]
	var acc lanes
	k := dotBFloat16Vec(&acc, x, y)
	return dotTail(&acc, x, y, k, widenBF16)
}

func widen32(v float32) float64  { return float64(v) }
func widen64(v float64) float64  { return v }
func widenF16(v uint16) float64  { return float64(half.F16ToF32(v)) }
func widenBF16(v uint16) float64 { return float64(half.BF16ToF32(v)) }

// sumsqGo adds the whole groups of sixteen of x into the lanes, as the
// assembly does, and returns how many elements it took. The explicit
// float64 conversion of each product keeps the compiler from fusing it with
// the addition (which Go allows on some architectures).
func sumsqGo[T any](acc *lanes, x []T, widen func(T) float64) int {
	n := len(x) &^ (normLanes - 1)
	for i := 0; i < n; i += normLanes {
		for j := range normLanes {
			v := widen(x[i+j])
			acc[j] += float64(v * v)
		}
	}
	return n
}

func dotGo[T any](acc *lanes, x, y []T, widen func(T) float64) int {
	n := len(x) &^ (normLanes - 1)
	for i := 0; i < n; i += normLanes {
		for j := range normLanes {
			acc[j] += float64(widen(x[i+j]) * widen(y[i+j]))
		}
	}
	return n
}

// sumsqTail combines the lanes and adds the elements from k on.
func sumsqTail[T any](acc *lanes, x []T, k int, widen func(T) float64) float64 {
	s := finish(acc)
	for _, e := range x[k:] {
		v := widen(e)
		s += float64(v * v)
	}
	return s
}

func dotTail[T any](acc *lanes, x, y []T, k int, widen func(T) float64) float64 {
	s := finish(acc)
	for i := k; i < len(x); i++ {
		s += float64(widen(x[i]) * widen(y[i]))
	}
	return s
}
