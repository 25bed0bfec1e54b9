package reduce

import (
	"math/rand/v2"
	"testing"
)

func TestKeepFloat32(t *testing.T)  { checkKeep(t, f32Norms()) }
func TestKeepFloat64(t *testing.T)  { checkKeep(t, f64Norms()) }
func TestKeepFloat16(t *testing.T)  { checkKeep(t, f16Norms()) }
func TestKeepBFloat16(t *testing.T) { checkKeep(t, bf16Norms()) }

// checkKeep holds the fused kernel to the separate ones bit for bit: its
// squares to SumSquares(x), its products to Dot(x, y) when prev holds y,
// and what it leaves in prev to x's bits, with prev's elements past len(x)
// untouched; and to the pure-Go lanes.
func checkKeep[T any](t *testing.T, c normCase[T]) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(len(c.kind.name)), 13))
	for _, n := range testLengths() {
		for off := range 4 {
			for _, gen := range []func(*rand.Rand) T{c.finiteGen, c.kind.gen} {
				x, y := make([]T, n), make([]T, n)
				for i := range x {
					x[i], y[i] = gen(r), gen(r)
				}
				x = at(off, x)
				guard := []T{gen(r), gen(r), gen(r)}
				prev := at((off+1)%4, append(append([]T(nil), y...), guard...))
				goPrev := append([]T(nil), prev...)

				sq, dot := c.keep(x, prev)
				if want := c.sumsq(x); !sameFloat(sq, want) {
					t.Fatalf("%s n=%d off=%d: Σx² %v, SumSquares %v", c.kind.name, n, off, sq, want)
				}
				if want := c.dot(x, y); !sameFloat(dot, want) {
					t.Fatalf("%s n=%d off=%d: Σx·prev %v, Dot %v", c.kind.name, n, off, dot, want)
				}
				checkKept(t, c, x, prev, guard)
				var acc pairLanes
				goSq, goDot := keepTail(&acc, x, goPrev, keepGo(&acc, x, goPrev, c.widen), c.widen)
				if !sameFloat(sq, goSq) || !sameFloat(dot, goDot) {
					t.Fatalf("%s n=%d off=%d: (%v, %v), pure Go (%v, %v)", c.kind.name, n, off, sq, dot, goSq, goDot)
				}
				checkKept(t, c, x, goPrev, guard)
			}
		}
	}
}

// checkKept checks that prev holds x's bits and then the guard's.
func checkKept[T any](t *testing.T, c normCase[T], x, prev, guard []T) {
	t.Helper()
	want := append(append([]T(nil), x...), guard...)
	for i := range want {
		if c.kind.bits(prev[i]) != c.kind.bits(want[i]) {
			t.Fatalf("%s n=%d: prev[%d] = %v, want %v", c.kind.name, len(x), i, prev[i], want[i])
		}
	}
}

// Successive calls chain: each step's products are with the step before.
func TestKeepChains(t *testing.T) {
	steps := [][]float32{{1, 2, 3}, {4, 5, 6}, {-1, 0, 2}}
	prev := make([]float32, 3)
	for i, x := range steps {
		sq, dot := SumSquaresDotKeepFloat32(x, prev)
		var wantDot float64
		if i > 0 {
			wantDot = DotFloat32(x, steps[i-1])
		}
		if sq != SumSquaresFloat32(x) || dot != wantDot {
			t.Errorf("step %d: (%v, %v), want (%v, %v)", i, sq, dot, SumSquaresFloat32(x), wantDot)
		}
	}
}

func BenchmarkSumSquaresDotKeep(b *testing.B) {
	for _, s := range []struct {
		name  string
		bytes int
	}{{"400KiB", 400 << 10}, {"4MiB", 4 << 20}} {
		x := make([]float32, s.bytes/4)
		for i := range x {
			x[i] = f32Val(i)
		}
		prev := make([]float32, len(x))
		b.Run("fused/"+s.name, func(b *testing.B) {
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresDotKeepFloat32(x, prev)
			}
		})
		// What the measurement did before the fused kernel: Σx², Σx·y and
		// a copy of x, each a pass of its own.
		y := make([]float32, len(x))
		b.Run("apart/"+s.name, func(b *testing.B) {
			b.SetBytes(int64(s.bytes))
			for b.Loop() {
				SumSquaresFloat32(x)
				DotFloat32(x, y)
				copy(y, x)
			}
		})
	}
}
