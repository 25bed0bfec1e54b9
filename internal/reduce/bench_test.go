package reduce

import (
	"testing"
)

// Throughput is reported per destination buffer (b.SetBytes of len(dst)
// elements), although each op reads two buffers and writes one.
var benchSizes = []struct {
	name  string
	bytes int
}{
	{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"256KiB", 256 << 10}, {"4MiB", 4 << 20}, {"64MiB", 64 << 20},
}

func benchBinary[T any](b *testing.B, size int, init func(i int) T, f func(dst, a, b []T)) {
	var zero T
	n := size / int(sizeOf(zero))
	dst, x, y := make([]T, n), make([]T, n), make([]T, n)
	for i := range x {
		x[i], y[i] = init(i), init(i+1)
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		f(dst, x, y)
	}
}

func sizeOf(v any) uintptr {
	switch v.(type) {
	case uint8:
		return 1
	case uint16:
		return 2
	case float32, int32:
		return 4
	}
	return 8
}

func runSizes[T any](b *testing.B, init func(i int) T, f func(dst, a, b []T)) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) { benchBinary(b, s.bytes, init, f) })
	}
}

func f32Val(i int) float32 { return 1 + float32(i%1000)/1000 }

func BenchmarkFloat32Sum(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, y []float32) { Float32(Sum, dst, x, y) })
}

// BenchmarkFloat32SumLoop is the baseline: what a plain Go loop achieves.
func BenchmarkFloat32SumLoop(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, y []float32) {
		x, y = x[:len(dst)], y[:len(dst)]
		for i := range dst {
			dst[i] = x[i] + y[i]
		}
	})
}

// BenchmarkFloat32SumInPlace is the usual collective case, accumulating into
// one of the sources.
func BenchmarkFloat32SumInPlace(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, y []float32) { Float32(Sum, x, x, y) })
}

// BenchmarkCopy is the memory roofline for comparison: copy moves one
// buffer, while a reduction reads two and writes one.
func BenchmarkCopy(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, _ []float32) { copy(dst, x) })
}

func BenchmarkFloat32Min(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, y []float32) { Float32(Min, dst, x, y) })
}

func BenchmarkFloat32Max(b *testing.B) {
	runSizes(b, f32Val, func(dst, x, y []float32) { Float32(Max, dst, x, y) })
}

func BenchmarkFloat64Sum(b *testing.B) {
	runSizes(b, func(i int) float64 { return float64(f32Val(i)) },
		func(dst, x, y []float64) { Float64(Sum, dst, x, y) })
}

func BenchmarkFloat16Sum(b *testing.B) {
	runSizes(b, func(i int) uint16 { return 0x3c00 + uint16(i%512) },
		func(dst, x, y []uint16) { Float16(Sum, dst, x, y) })
}

func BenchmarkBFloat16Sum(b *testing.B) {
	runSizes(b, func(i int) uint16 { return 0x3f80 + uint16(i%64) },
		func(dst, x, y []uint16) { BFloat16(Sum, dst, x, y) })
}

func BenchmarkInt32Sum(b *testing.B) {
	runSizes(b, func(i int) int32 { return int32(i) },
		func(dst, x, y []int32) { Int32(Sum, dst, x, y) })
}

// The pure-Go 16-bit kernels, for comparison with the vector ones.
func BenchmarkFloat16SumGo(b *testing.B) {
	benchBinary(b, 64<<10, func(i int) uint16 { return 0x3c00 + uint16(i%512) },
		func(dst, x, y []uint16) { float16Go(Sum, dst, x, y) })
}

func BenchmarkScale(b *testing.B) {
	const size = 64 << 10
	b.Run("Float32", func(b *testing.B) {
		benchBinary(b, size, f32Val, func(dst, x, _ []float32) { ScaleFloat32(dst, x, 0.25) })
	})
	b.Run("Float16", func(b *testing.B) {
		benchBinary(b, size, func(i int) uint16 { return 0x3c00 + uint16(i%512) },
			func(dst, x, _ []uint16) { ScaleFloat16(dst, x, 0.25) })
	})
	b.Run("BFloat16", func(b *testing.B) {
		benchBinary(b, size, func(i int) uint16 { return 0x3f80 + uint16(i%64) },
			func(dst, x, _ []uint16) { ScaleBFloat16(dst, x, 0.25) })
	})
	b.Run("DivInt32", func(b *testing.B) {
		benchBinary(b, size, func(i int) int32 { return int32(i) },
			func(dst, x, _ []int32) { DivInt32(dst, x, 3) })
	})
}
