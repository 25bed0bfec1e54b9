package reduce

// The *Vec norm functions run the assembly kernels when the CPU has them,
// and the pure-Go lanes otherwise; either way they return how many leading
// elements they took (whole groups of sixteen).

func sumsqFloat32Vec(acc *lanes, x []float32) int {
	if !hasAVX2 {
		return sumsqGo(acc, x, widen32)
	}
	n := len(x) &^ (normLanes - 1)
	sumsqF32AVX2(acc, x[:n])
	return n
}

func sumsqFloat64Vec(acc *lanes, x []float64) int {
	if !hasAVX2 {
		return sumsqGo(acc, x, widen64)
	}
	n := len(x) &^ (normLanes - 1)
	sumsqF64AVX2(acc, x[:n])
	return n
}

func sumsqFloat16Vec(acc *lanes, x []uint16) int {
	if !hasF16C {
		return sumsqGo(acc, x, widenF16)
	}
	n := len(x) &^ (normLanes - 1)
	sumsqF16AVX2(acc, x[:n])
	return n
}

func sumsqBFloat16Vec(acc *lanes, x []uint16) int {
	if !hasAVX2 {
		return sumsqGo(acc, x, widenBF16)
	}
	n := len(x) &^ (normLanes - 1)
	sumsqBF16AVX2(acc, x[:n])
	return n
}

func dotFloat32Vec(acc *lanes, x, y []float32) int {
	if !hasAVX2 {
		return dotGo(acc, x, y, widen32)
	}
	n := len(x) &^ (normLanes - 1)
	dotF32AVX2(acc, x[:n], y[:n])
	return n
}

func dotFloat64Vec(acc *lanes, x, y []float64) int {
	if !hasAVX2 {
		return dotGo(acc, x, y, widen64)
	}
	n := len(x) &^ (normLanes - 1)
	dotF64AVX2(acc, x[:n], y[:n])
	return n
}

func dotFloat16Vec(acc *lanes, x, y []uint16) int {
	if !hasF16C {
		return dotGo(acc, x, y, widenF16)
	}
	n := len(x) &^ (normLanes - 1)
	dotF16AVX2(acc, x[:n], y[:n])
	return n
}

func dotBFloat16Vec(acc *lanes, x, y []uint16) int {
	if !hasAVX2 {
		return dotGo(acc, x, y, widenBF16)
	}
	n := len(x) &^ (normLanes - 1)
	dotBF16AVX2(acc, x[:n], y[:n])
	return n
}

func keepFloat32Vec(acc *pairLanes, x, prev []float32) int {
	if !hasAVX2 {
		return keepGo(acc, x, prev, widen32)
	}
	n := len(x) &^ (normLanes - 1)
	keepF32AVX2(acc, x[:n], prev[:n])
	return n
}

func keepFloat64Vec(acc *pairLanes, x, prev []float64) int {
	if !hasAVX2 {
		return keepGo(acc, x, prev, widen64)
	}
	n := len(x) &^ (normLanes - 1)
	keepF64AVX2(acc, x[:n], prev[:n])
	return n
}

func keepFloat16Vec(acc *pairLanes, x, prev []uint16) int {
	if !hasF16C {
		return keepGo(acc, x, prev, widenF16)
	}
	n := len(x) &^ (normLanes - 1)
	keepF16AVX2(acc, x[:n], prev[:n])
	return n
}

func keepBFloat16Vec(acc *pairLanes, x, prev []uint16) int {
	if !hasAVX2 {
		return keepGo(acc, x, prev, widenBF16)
	}
	n := len(x) &^ (normLanes - 1)
	keepBF16AVX2(acc, x[:n], prev[:n])
	return n
}
