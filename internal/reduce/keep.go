package reduce

// The keep kernels fuse what the one-replica gradient noise estimate does
// to each step's gradient: its squared norm, its inner product with the
// previous step's gradient, and keeping it for the next step. They return
// Σ x[i]² and Σ x[i]·prev[i] over i < len(x), bit for bit what SumSquares*
// and Dot* return (the same widening, lanes and order), and then copy x
// over prev[:len(x)]: one pass instead of three (Σx², Σx·prev and a copy),
// costing about what a Dot pass costs.

type pairLanes = [2 * normLanes]float64

// SumSquaresDotKeepFloat32 returns Σx² and Σx·prev, then stores x in prev.
// prev must be at least as long as x.
func SumSquaresDotKeepFloat32(x, prev []float32) (sq, dot float64) {
	prev = prev[:len(x)]
	var acc pairLanes
	k := keepFloat32Vec(&acc, x, prev)
	return keepTail(&acc, x, prev, k, widen32)
}

// SumSquaresDotKeepFloat64 returns Σx² and Σx·prev, then stores x in prev.
func SumSquaresDotKeepFloat64(x, prev []float64) (sq, dot float64) {
	prev = prev[:len(x)]
	var acc pairLanes
	k := keepFloat64Vec(&acc, x, prev)
	return keepTail(&acc, x, prev, k, widen64)
}

// SumSquaresDotKeepFloat16 returns Σx² and Σx·prev of binary16 bits, then
// stores x in prev.
func SumSquaresDotKeepFloat16(x, prev []uint16) (sq, dot float64) {
	prev = prev[:len(x)]
	var acc pairLanes
	k := keepFloat16Vec(&acc, x, prev)
	return keepTail(&acc, x, prev, k, widenF16)
}

// SumSquaresDotKeepBFloat16 returns Σx² and Σx·prev of bfloat16 bits, then
// stores x in prev.
func SumSquaresDotKeepBFloat16(x, prev []uint16) (sq, dot float64) {
	prev = prev[:len(x)]
	var acc pairLanes
	k := keepBFloat16Vec(&acc, x, prev)
	return keepTail(&acc, x, prev, k, widenBF16)
}

// keepGo is the pure-Go kernel: whole groups of sixteen, the squares in
// acc[:16] and the products in acc[16:], as the assembly does. The explicit
// float64 conversions keep the compiler from fusing a product with its sum.
func keepGo[T any](acc *pairLanes, x, prev []T, widen func(T) float64) int {
	n := len(x) &^ (normLanes - 1)
	for i := 0; i < n; i += normLanes {
		for j := range normLanes {
			v := widen(x[i+j])
			acc[j] += float64(v * v)
			acc[normLanes+j] += float64(v * widen(prev[i+j]))
			prev[i+j] = x[i+j]
		}
	}
	return n
}

// keepTail combines the lanes and does the elements from k on.
func keepTail[T any](acc *pairLanes, x, prev []T, k int, widen func(T) float64) (sq, dot float64) {
	sq = finish((*lanes)(acc[:normLanes]))
	dot = finish((*lanes)(acc[normLanes:]))
	for i := k; i < len(x); i++ {
		v := widen(x[i])
		sq += float64(v * v)
		dot += float64(v * widen(prev[i]))
		prev[i] = x[i]
	}
	return sq, dot
}
