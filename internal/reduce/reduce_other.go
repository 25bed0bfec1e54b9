//go:build !amd64

package reduce

// Without assembly kernels everything runs in the pure-Go kernels: each
// *Vec function handles no prefix.

func float32Vec(Op, []float32, []float32, []float32) int { return 0 }
func float64Vec(Op, []float64, []float64, []float64) int { return 0 }
func float16Vec(Op, []uint16, []uint16, []uint16) int    { return 0 }
func bfloat16Vec(Op, []uint16, []uint16, []uint16) int   { return 0 }
func int32Vec(Op, []int32, []int32, []int32) int         { return 0 }
func int64Vec(Op, []int64, []int64, []int64) int         { return 0 }
func uint8Vec(Op, []uint8, []uint8, []uint8) int         { return 0 }

func scaleFloat32Vec([]float32, []float32, float32) int { return 0 }
func scaleFloat64Vec([]float64, []float64, float64) int { return 0 }
func scaleFloat16Vec([]uint16, []uint16, float32) int   { return 0 }
func scaleBFloat16Vec([]uint16, []uint16, float32) int  { return 0 }

func sumsqFloat32Vec(acc *lanes, x []float32) int  { return sumsqGo(acc, x, widen32) }
func sumsqFloat64Vec(acc *lanes, x []float64) int  { return sumsqGo(acc, x, widen64) }
func sumsqFloat16Vec(acc *lanes, x []uint16) int   { return sumsqGo(acc, x, widenF16) }
func sumsqBFloat16Vec(acc *lanes, x []uint16) int  { return sumsqGo(acc, x, widenBF16) }
func dotFloat32Vec(acc *lanes, x, y []float32) int { return dotGo(acc, x, y, widen32) }
func dotFloat64Vec(acc *lanes, x, y []float64) int { return dotGo(acc, x, y, widen64) }
func dotFloat16Vec(acc *lanes, x, y []uint16) int  { return dotGo(acc, x, y, widenF16) }
func dotBFloat16Vec(acc *lanes, x, y []uint16) int { return dotGo(acc, x, y, widenBF16) }

func keepFloat32Vec(acc *pairLanes, x, prev []float32) int {
	return keepGo(acc, x, prev, widen32)
}
func keepFloat64Vec(acc *pairLanes, x, prev []float64) int {
	return keepGo(acc, x, prev, widen64)
}
func keepFloat16Vec(acc *pairLanes, x, prev []uint16) int {
	return keepGo(acc, x, prev, widenF16)
}
func keepBFloat16Vec(acc *pairLanes, x, prev []uint16) int {
	return keepGo(acc, x, prev, widenBF16)
}
