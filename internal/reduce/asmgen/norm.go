package main

import "fmt"

// The norm kernels reduce a buffer to sums of products, in float64: sumsq
// adds x[i]², dot adds x[i]·y[i]. Each handles len(x) rounded down to a
// multiple of normLanes and adds into acc, whose lane j sums elements
// j, j+16, j+32, ... in order; the Go caller combines the lanes and does
// the tail. Every element is widened to float64 before it is multiplied,
// so a product of float32, float16 or bfloat16 values is exact and only
// the additions round: the pure-Go kernels, which keep the same sixteen
// lanes, give bit-identical sums. There is no FMA, for the same reason.
//
// Register plan: AX points at acc, SI and DX walk x and y, CX counts the
// elements left; Y0-Y3 are the lanes, Y4-Y7 hold x and Y8-Y11 y.

// normLanes is how many elements one iteration takes: four vectors of four
// float64 lanes.
const normLanes = 16

// normType says how to widen four elements of one type into a YMM register
// of float64s.
type normType struct {
	tag, goType string
	size        int // bytes per element
	widen       func(addr, y string) []string
}

func normTypes() []normType {
	return []normType{
		{"F32", "float32", 4, func(addr, y string) []string { return []string{ins("VCVTPS2PD", addr, y)} }},
		{"F64", "float64", 8, func(addr, y string) []string { return []string{ins("VMOVUPD", addr, y)} }},
		{"F16", "uint16", 2, func(addr, y string) []string {
			return []string{ins("VCVTPH2PS", addr, xmm(y)), ins("VCVTPS2PD", xmm(y), y)}
		}},
		// bfloat16 is the high half of a float32: zero-extend each word to a
		// doubleword and shift it up.
		{"BF16", "uint16", 2, func(addr, y string) []string {
			return []string{ins("VPMOVZXWD", addr, xmm(y)), ins("VPSLLD", "$16", xmm(y), xmm(y)), ins("VCVTPS2PD", xmm(y), y)}
		}},
	}
}

type normKernel struct {
	name, params string
	args         int
	dot          bool
	t            normType
}

func normKernels() []normKernel {
	var ks []normKernel
	for _, t := range normTypes() {
		ks = append(ks,
			normKernel{name: "sumsq" + t.tag + "AVX2", params: "acc *[16]float64, x []" + t.goType, args: 32, t: t},
			normKernel{name: "dot" + t.tag + "AVX2", params: "acc *[16]float64, x, y []" + t.goType, args: 56, dot: true, t: t})
	}
	return ks
}

func (k normKernel) text() []string {
	code := []string{
		fmt.Sprintf("// func %s(%s)", k.name, k.params),
		fmt.Sprintf("TEXT ·%s(SB), NOSPLIT, $0-%d", k.name, k.args),
		ins("MOVQ", "acc+0(FP)", "AX"),
		ins("MOVQ", "x_base+8(FP)", "SI"),
		ins("MOVQ", "x_len+16(FP)", "CX"),
	}
	if k.dot {
		code = append(code, ins("MOVQ", "y_base+32(FP)", "DX"))
	}
	for i := range 4 {
		code = append(code, ins("VMOVUPD", mem(32*i, "AX"), fmt.Sprintf("Y%d", i)))
	}
	count := fmt.Sprintf("$%d", normLanes)
	code = append(code, ins("CMPQ", "CX", count), ins("JB", "done"), "loop:")
	step := 4 * k.t.size // bytes of four elements
	for i := range 4 {
		x := fmt.Sprintf("Y%d", 4+i)
		code = append(code, k.t.widen(mem(i*step, "SI"), x)...)
		if k.dot {
			y := fmt.Sprintf("Y%d", 8+i)
			code = append(code, k.t.widen(mem(i*step, "DX"), y)...)
			code = append(code, ins("VMULPD", y, x, x))
		} else {
			code = append(code, ins("VMULPD", x, x, x))
		}
		code = append(code, ins("VADDPD", x, fmt.Sprintf("Y%d", i), fmt.Sprintf("Y%d", i)))
	}
	code = append(code, ins("ADDQ", fmt.Sprintf("$%d", 4*step), "SI"))
	if k.dot {
		code = append(code, ins("ADDQ", fmt.Sprintf("$%d", 4*step), "DX"))
	}
	code = append(code, ins("SUBQ", count, "CX"), ins("CMPQ", "CX", count), ins("JAE", "loop"), "done:")
	for i := range 4 {
		code = append(code, ins("VMOVUPD", fmt.Sprintf("Y%d", i), mem(32*i, "AX")))
	}
	return append(code, ins("VZEROUPPER"), ins("RET"))
}

// The keep kernels are the one-replica noise estimate's whole pass over a
// gradient: they add x[i]² into acc[0:16] and x[i]·prev[i] into
// acc[16:32], lane by lane as sumsq and dot do, and then copy x's sixteen
// elements over prev's, which were read first: the previous step's
// gradient is replaced by this one in the same pass. (Keeping prev widened
// to float64 would spare its conversion but moves twice the bytes; it
// measured slower here on a 100k-float gradient, whose float64 copy does
// not fit in a 1 MiB L2 cache beside it.)
//
// Register plan: AX points at acc, SI walks x and DX prev, CX counts the
// elements left; Y0-Y3 are the squares' lanes, Y4-Y7 the products', Y8-Y11
// hold x widened and Y12-Y15 prev; once the products are summed Y8-Y11
// carry the copy.
type keepKernel struct{ t normType }

func keepKernels() []keepKernel {
	var ks []keepKernel
	for _, t := range normTypes() {
		ks = append(ks, keepKernel{t})
	}
	return ks
}

func (k keepKernel) name() string { return "keep" + k.t.tag + "AVX2" }

func (k keepKernel) params() string { return "acc *[32]float64, x, prev []" + k.t.goType }

func (k keepKernel) text() []string {
	code := []string{
		fmt.Sprintf("// func %s(%s)", k.name(), k.params()),
		fmt.Sprintf("TEXT ·%s(SB), NOSPLIT, $0-56", k.name()),
		ins("MOVQ", "acc+0(FP)", "AX"),
		ins("MOVQ", "x_base+8(FP)", "SI"),
		ins("MOVQ", "x_len+16(FP)", "CX"),
		ins("MOVQ", "prev_base+32(FP)", "DX"),
	}
	for i := range 8 {
		code = append(code, ins("VMOVUPD", mem(32*i, "AX"), fmt.Sprintf("Y%d", i)))
	}
	count := fmt.Sprintf("$%d", normLanes)
	code = append(code, ins("CMPQ", "CX", count), ins("JB", "done"), "loop:")
	step := 4 * k.t.size // bytes of four elements
	for i := range 4 {
		sq, dot := fmt.Sprintf("Y%d", i), fmt.Sprintf("Y%d", 4+i)
		x, p := fmt.Sprintf("Y%d", 8+i), fmt.Sprintf("Y%d", 12+i)
		code = append(code, k.t.widen(mem(i*step, "SI"), x)...)
		code = append(code, k.t.widen(mem(i*step, "DX"), p)...)
		code = append(code,
			ins("VMULPD", x, p, p),
			ins("VADDPD", p, dot, dot),
			ins("VMULPD", x, x, x),
			ins("VADDPD", x, sq, sq))
	}
	block := normLanes * k.t.size // bytes copied per iteration
	for off := 0; off < block; off += 32 {
		y := fmt.Sprintf("Y%d", 8+off/32)
		code = append(code, ins("VMOVDQU", mem(off, "SI"), y), ins("VMOVDQU", y, mem(off, "DX")))
	}
	code = append(code,
		ins("ADDQ", fmt.Sprintf("$%d", block), "SI"),
		ins("ADDQ", fmt.Sprintf("$%d", block), "DX"),
		ins("SUBQ", count, "CX"), ins("CMPQ", "CX", count), ins("JAE", "loop"), "done:")
	for i := range 8 {
		code = append(code, ins("VMOVUPD", fmt.Sprintf("Y%d", i), mem(32*i, "AX")))
	}
	return append(code, ins("VZEROUPPER"), ins("RET"))
}
