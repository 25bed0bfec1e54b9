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
