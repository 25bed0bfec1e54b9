package reduce

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/gorovod/gorovod/internal/half"
)

// normCase is one element type's norm kernels with their pure-Go
// references (the same lanes, no assembly) and an independent definition.
type normCase[T any] struct {
	kind      kind[T]
	sumsq     func([]T) float64
	dot       func(x, y []T) float64
	keep      func(x, prev []T) (sq, dot float64)
	widen     func(T) float64
	finiteGen func(r *rand.Rand) T
}

func f32Norms() normCase[float32] {
	return normCase[float32]{f32Kind, SumSquaresFloat32, DotFloat32, SumSquaresDotKeepFloat32, widen32, func(r *rand.Rand) float32 { return float32(finiteVal(r)) }}
}

func f64Norms() normCase[float64] {
	return normCase[float64]{f64Kind, SumSquaresFloat64, DotFloat64, SumSquaresDotKeepFloat64, widen64, finiteVal}
}

func f16Norms() normCase[uint16] {
	return normCase[uint16]{f16Kind, SumSquaresFloat16, DotFloat16, SumSquaresDotKeepFloat16, widenF16, func(r *rand.Rand) uint16 { return half.F32ToF16(float32(finiteVal(r) / 64)) }}
}

func bf16Norms() normCase[uint16] {
	return normCase[uint16]{bf16Kind, SumSquaresBFloat16, DotBFloat16, SumSquaresDotKeepBFloat16, widenBF16, func(r *rand.Rand) uint16 { return half.F32ToBF16(float32(finiteVal(r))) }}
}

// finiteVal is a gradient-like value: mostly small, of both signs, with an
// occasional zero or larger one.
func finiteVal(r *rand.Rand) float64 {
	switch r.IntN(8) {
	case 0:
		return 0
	case 1:
		return (r.Float64()*2 - 1) * 1000
	}
	return r.NormFloat64() * math.Ldexp(1, r.IntN(20)-15)
}

func TestNormsFloat32(t *testing.T)  { checkNorms(t, f32Norms()) }
func TestNormsFloat64(t *testing.T)  { checkNorms(t, f64Norms()) }
func TestNormsFloat16(t *testing.T)  { checkNorms(t, f16Norms()) }
func TestNormsBFloat16(t *testing.T) { checkNorms(t, bf16Norms()) }

// checkNorms holds the public (vector) kernels to the pure-Go lanes bit for
// bit, on finite data and on arbitrary bit patterns, and to an exact sum
// within rounding.
func checkNorms[T any](t *testing.T, c normCase[T]) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(len(c.kind.name)), 11))
	for _, n := range testLengths() {
		for off := range 4 {
			for _, gen := range []func(*rand.Rand) T{c.finiteGen, c.kind.gen} {
				x := make([]T, n)
				y := make([]T, n+3) // longer than x: only len(x) counts
				for i := range x {
					x[i], y[i] = gen(r), gen(r)
				}
				x, y = at(off, x), at((off+1)%4, y)
				var acc lanes
				wantSq := sumsqTail(&acc, x, sumsqGo(&acc, x, c.widen), c.widen)
				acc = lanes{}
				wantDot := dotTail(&acc, x, y, dotGo(&acc, x, y, c.widen), c.widen)
				if got := c.sumsq(x); !sameFloat(got, wantSq) {
					t.Fatalf("%s sumsq n=%d off=%d: %v, pure Go %v", c.kind.name, n, off, got, wantSq)
				}
				if got := c.dot(x, y); !sameFloat(got, wantDot) {
					t.Fatalf("%s dot n=%d off=%d: %v, pure Go %v", c.kind.name, n, off, got, wantDot)
				}
				exactSq, exactDot, bound := exactNorms(x, y, c.widen)
				if math.IsNaN(exactSq) || math.IsInf(bound, 0) {
					continue // specials: checked below
				}
				// n additions of values at most bound each round by at most
				// n·2⁻⁵³·(running sum ≤ bound).
				tol := float64(n+1) * 0x1p-52 * bound
				if got := c.sumsq(x); math.Abs(got-exactSq) > tol {
					t.Fatalf("%s sumsq n=%d: %v, exact %v (tolerance %v)", c.kind.name, n, got, exactSq, tol)
				}
				if got := c.dot(x, y); math.Abs(got-exactDot) > tol {
					t.Fatalf("%s dot n=%d: %v, exact %v (tolerance %v)", c.kind.name, n, got, exactDot, tol)
				}
			}
		}
	}
}

func sameFloat(a, b float64) bool {
	return math.Float64bits(a) == math.Float64bits(b) || (math.IsNaN(a) && math.IsNaN(b))
}

// exactNorms computes Σx² and Σx·y exactly (big.Float with enough
// precision), rounded once, and Σ|x·y| + Σx² for the rounding bound.
func exactNorms[T any](x, y []T, widen func(T) float64) (sq, dot, bound float64) {
	s, d := new(big.Float).SetPrec(4096), new(big.Float).SetPrec(4096)
	var abs float64
	for i := range x {
		a, b := widen(x[i]), widen(y[i])
		if math.IsNaN(a) || math.IsNaN(b) || math.IsInf(a, 0) || math.IsInf(b, 0) {
			return math.NaN(), math.NaN(), math.Inf(1)
		}
		fa, fb := new(big.Float).SetPrec(4096).SetFloat64(a), new(big.Float).SetPrec(4096).SetFloat64(b)
		s.Add(s, new(big.Float).SetPrec(4096).Mul(fa, fa))
		d.Add(d, new(big.Float).SetPrec(4096).Mul(fa, fb))
		abs += a*a + math.Abs(a*b)
	}
	sq, _ = s.Float64()
	dot, _ = d.Float64()
	return sq, dot, abs
}

// Special values propagate: a NaN makes every sum NaN, an infinity makes
// Σx² infinite and Σx·y NaN when it meets a zero.
func TestNormSpecials(t *testing.T) {
	for _, n := range []int{1, 15, 16, 17, 100} {
		for _, pos := range []int{0, n / 2, n - 1} {
			x := make([]float32, n)
			for i := range x {
				x[i] = 1
			}
			x[pos] = float32(math.NaN())
			if v := SumSquaresFloat32(x); !math.IsNaN(v) {
				t.Errorf("n=%d NaN at %d: Σx² = %v", n, pos, v)
			}
			x[pos] = float32(math.Inf(-1))
			if v := SumSquaresFloat32(x); !math.IsInf(v, 1) {
				t.Errorf("n=%d -Inf at %d: Σx² = %v", n, pos, v)
			}
			y := make([]float32, n)
			if v := DotFloat32(x, y); !math.IsNaN(v) {
				t.Errorf("n=%d: Inf·0 summed to %v", n, v)
			}
			h := make([]uint16, n)
			h[pos] = 0x7c00 // +Inf in binary16
			if v := SumSquaresFloat16(h); !math.IsInf(v, 1) {
				t.Errorf("n=%d float16 +Inf at %d: Σx² = %v", n, pos, v)
			}
		}
	}
	// float16's largest value squares far beyond its own range, not float64's.
	big := make([]uint16, 40)
	for i := range big {
		big[i] = 0x7bff // 65504
	}
	if got, want := SumSquaresFloat16(big), 40*65504.0*65504; got != want {
		t.Errorf("Σ 65504² ×40 = %v, want %v", got, want)
	}
}

func FuzzNorms(f *testing.F) {
	f.Add([]byte{0x00, 0x3c, 0x00, 0xbc}, uint8(0))
	f.Add(make([]byte, 200), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, off uint8) {
		n := len(data) / 4
		a, b := make([]uint16, n), make([]uint16, n)
		for i := range n {
			a[i] = uint16(data[4*i]) | uint16(data[4*i+1])<<8
			b[i] = uint16(data[4*i+2]) | uint16(data[4*i+3])<<8
		}
		k := int(off) % (n + 1)
		a, b = at(k%8, a[k:]), b[k:]
		for _, c := range []normCase[uint16]{f16Norms(), bf16Norms()} {
			var acc lanes
			want := sumsqTail(&acc, a, sumsqGo(&acc, a, c.widen), c.widen)
			if got := c.sumsq(a); !sameFloat(got, want) {
				t.Fatalf("%s sumsq: %v, pure Go %v", c.kind.name, got, want)
			}
			acc = lanes{}
			want = dotTail(&acc, a, b, dotGo(&acc, a, b, c.widen), c.widen)
			if got := c.dot(a, b); !sameFloat(got, want) {
				t.Fatalf("%s dot: %v, pure Go %v", c.kind.name, got, want)
			}
			fuzzKeep(t, c, a, b)
		}
		f32 := make([]float32, len(a)/2)
		for i := range f32 {
			f32[i] = math.Float32frombits(uint32(a[2*i]) | uint32(a[2*i+1])<<16)
		}
		var acc lanes
		want := sumsqTail(&acc, f32, sumsqGo(&acc, f32, widen32), widen32)
		if got := SumSquaresFloat32(f32); !sameFloat(got, want) {
			t.Fatalf("float32 sumsq: %v, pure Go %v", got, want)
		}
		fuzzKeep(t, f32Norms(), f32, f32[len(f32)/2:])
	})
}

func BenchmarkSumSquares(b *testing.B) {
	for _, s := range []struct {
		name  string
		bytes int
	}{{"400KiB", 400 << 10}, {"4MiB", 4 << 20}} {
		b.Run("float32/"+s.name, func(b *testing.B) {
			x := make([]float32, s.bytes/4)
			for i := range x {
				x[i] = f32Val(i)
			}
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresFloat32(x)
			}
		})
		b.Run("float32-go/"+s.name, func(b *testing.B) {
			x := make([]float32, s.bytes/4)
			for i := range x {
				x[i] = f32Val(i)
			}
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				var acc lanes
				sumsqTail(&acc, x, sumsqGo(&acc, x, widen32), widen32)
			}
		})
		b.Run("float64/"+s.name, func(b *testing.B) {
			x := make([]float64, s.bytes/8)
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresFloat64(x)
			}
		})
		b.Run("float16/"+s.name, func(b *testing.B) {
			x := make([]uint16, s.bytes/2)
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresFloat16(x)
			}
		})
		b.Run("bfloat16/"+s.name, func(b *testing.B) {
			x := make([]uint16, s.bytes/2)
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresBFloat16(x)
			}
		})
		b.Run("dot-float32/"+s.name, func(b *testing.B) {
			x, y := make([]float32, s.bytes/4), make([]float32, s.bytes/4)
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				DotFloat32(x, y)
			}
		})
	}
}

// fuzzKeep checks the fused kernel against the separate ones and the
// pure-Go lanes on arbitrary bits: x, and y as the previous step (as long
// as x or shorter: then x is cut to it).
func fuzzKeep[T any](t *testing.T, c normCase[T], x, y []T) {
	t.Helper()
	x = x[:min(len(x), len(y))]
	y = y[:len(x)]
	prev, goPrev := append([]T(nil), y...), append([]T(nil), y...)
	sq, dot := c.keep(x, prev)
	var acc pairLanes
	goSq, goDot := keepTail(&acc, x, goPrev, keepGo(&acc, x, goPrev, c.widen), c.widen)
	if !sameFloat(sq, goSq) || !sameFloat(dot, goDot) || !sameFloat(sq, c.sumsq(x)) || !sameFloat(dot, c.dot(x, y)) {
		t.Fatalf("%s keep: (%v, %v), pure Go (%v, %v), apart (%v, %v)", c.kind.name, sq, dot, goSq, goDot, c.sumsq(x), c.dot(x, y))
	}
	for i := range x {
		if c.kind.bits(prev[i]) != c.kind.bits(x[i]) || c.kind.bits(goPrev[i]) != c.kind.bits(x[i]) {
			t.Fatalf("%s keep: prev[%d] = %v, pure Go %v, want %v", c.kind.name, i, prev[i], goPrev[i], x[i])
		}
	}
}
