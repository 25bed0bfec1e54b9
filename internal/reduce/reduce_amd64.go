package reduce

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run ./asmgen -asm kernels_amd64.s -go kernels_amd64.go

// Set once at init and only read afterwards. F16C is reported without
// checking OS support for YMM state, so it is only trusted alongside AVX2,
// which is.
var (
	hasAVX2 = cpu.X86.HasAVX2
	hasF16C = cpu.X86.HasAVX2 && cpu.X86.HasF16C
)

// streamBytes is the destination size from which the binary kernels store
// around the cache, when dst is neither source. On the 2-core Xeon VM this
// was tuned on, a 64 MiB float32 Sum gains about 40% from it and a 16 MiB
// one nothing; below that the result is likely still cached when the next
// collective step sends it, and streaming would throw that away. In place,
// the line is in cache already and streaming only hurts.
const streamBytes = 16 << 20

// streamHead decides whether to stream stores to dst and, if so, how many
// leading elements to leave to the caller so the rest is 32-byte aligned,
// as VMOVNTDQ requires.
func streamHead[T any](dst, a, b []T) (head int, stream bool) {
	if len(dst) == 0 {
		return 0, false
	}
	size := int(unsafe.Sizeof(dst[0]))
	if len(dst)*size < streamBytes || &dst[0] == &a[0] || &dst[0] == &b[0] {
		return 0, false
	}
	misalign := -uintptr(unsafe.Pointer(&dst[0])) % 32
	return int(misalign) / size, true
}

// The *Vec functions run the assembly kernels, if there are any for op and
// the CPU, over the longest prefix of dst they can handle, and return its
// length; the *Asm functions below them pick the kernel. A switch rather
// than a table of funcs keeps the calls direct, so go:noescape holds and
// callers' buffers need not escape.

func float32Vec(op Op, dst, a, b []float32) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	float32Go(op, dst[:h], a, b)
	return h + float32Asm(op, dst[h:], a[h:], b[h:], s)
}

func float64Vec(op Op, dst, a, b []float64) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	float64Go(op, dst[:h], a, b)
	return h + float64Asm(op, dst[h:], a[h:], b[h:], s)
}

func float16Vec(op Op, dst, a, b []uint16) int {
	if !hasF16C {
		return 0
	}
	h, s := streamHead(dst, a, b)
	float16Go(op, dst[:h], a, b)
	return h + float16Asm(op, dst[h:], a[h:], b[h:], s)
}

func bfloat16Vec(op Op, dst, a, b []uint16) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	bfloat16Go(op, dst[:h], a, b)
	return h + bfloat16Asm(op, dst[h:], a[h:], b[h:], s)
}

func int32Vec(op Op, dst, a, b []int32) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	intGo(op, dst[:h], a, b)
	return h + int32Asm(op, dst[h:], a[h:], b[h:], s)
}

func int64Vec(op Op, dst, a, b []int64) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	intGo(op, dst[:h], a, b)
	return h + int64Asm(op, dst[h:], a[h:], b[h:], s)
}

func uint8Vec(op Op, dst, a, b []uint8) int {
	if !hasAVX2 {
		return 0
	}
	h, s := streamHead(dst, a, b)
	intGo(op, dst[:h], a, b)
	return h + uint8Asm(op, dst[h:], a[h:], b[h:], s)
}

func float32Asm(op Op, dst, a, b []float32, stream bool) int {
	n := len(dst) &^ 7
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumF32AVX2(dst[:n], a, b, stream)
	case Prod:
		prodF32AVX2(dst[:n], a, b, stream)
	case Min:
		minF32AVX2(dst[:n], a, b, stream)
	case Max:
		maxF32AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

func float64Asm(op Op, dst, a, b []float64, stream bool) int {
	n := len(dst) &^ 3
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumF64AVX2(dst[:n], a, b, stream)
	case Prod:
		prodF64AVX2(dst[:n], a, b, stream)
	case Min:
		minF64AVX2(dst[:n], a, b, stream)
	case Max:
		maxF64AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

func float16Asm(op Op, dst, a, b []uint16, stream bool) int {
	n := len(dst) &^ 7
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumF16AVX2(dst[:n], a, b, stream)
	case Prod:
		prodF16AVX2(dst[:n], a, b, stream)
	case Min:
		minF16AVX2(dst[:n], a, b, stream)
	case Max:
		maxF16AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

func bfloat16Asm(op Op, dst, a, b []uint16, stream bool) int {
	n := len(dst) &^ 15
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumBF16AVX2(dst[:n], a, b, stream)
	case Prod:
		prodBF16AVX2(dst[:n], a, b, stream)
	case Min:
		minBF16AVX2(dst[:n], a, b, stream)
	case Max:
		maxBF16AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

func int32Asm(op Op, dst, a, b []int32, stream bool) int {
	n := len(dst) &^ 7
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumI32AVX2(dst[:n], a, b, stream)
	case Prod:
		prodI32AVX2(dst[:n], a, b, stream)
	case Min:
		minI32AVX2(dst[:n], a, b, stream)
	case Max:
		maxI32AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

// int64Asm has no Prod: a 64-bit lane multiply (VPMULLQ) needs AVX-512.
func int64Asm(op Op, dst, a, b []int64, stream bool) int {
	n := len(dst) &^ 3
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumI64AVX2(dst[:n], a, b, stream)
	case Min:
		minI64AVX2(dst[:n], a, b, stream)
	case Max:
		maxI64AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

// uint8Asm has no Prod: x86 has no byte multiply.
func uint8Asm(op Op, dst, a, b []uint8, stream bool) int {
	n := len(dst) &^ 31
	if n == 0 {
		return 0
	}
	switch op {
	case Sum:
		sumU8AVX2(dst[:n], a, b, stream)
	case Min:
		minU8AVX2(dst[:n], a, b, stream)
	case Max:
		maxU8AVX2(dst[:n], a, b, stream)
	default:
		return 0
	}
	return n
}

// Scaling is mostly in place, so it never streams.

func scaleFloat32Vec(dst, src []float32, f float32) int {
	n := len(dst) &^ 7
	if !hasAVX2 || n == 0 {
		return 0
	}
	scaleF32AVX2(dst[:n], src, f)
	return n
}

func scaleFloat64Vec(dst, src []float64, f float64) int {
	n := len(dst) &^ 3
	if !hasAVX2 || n == 0 {
		return 0
	}
	scaleF64AVX2(dst[:n], src, f)
	return n
}

func scaleFloat16Vec(dst, src []uint16, f float32) int {
	n := len(dst) &^ 7
	if !hasF16C || n == 0 {
		return 0
	}
	scaleF16AVX2(dst[:n], src, f)
	return n
}

func scaleBFloat16Vec(dst, src []uint16, f float32) int {
	n := len(dst) &^ 15
	if !hasAVX2 || n == 0 {
		return 0
	}
	scaleBF16AVX2(dst[:n], src, f)
	return n
}
