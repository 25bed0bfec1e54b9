package main

import (
	"fmt"
	"strings"
)

// Register plan: SI and DX walk the sources, DI the destination, CX counts
// the elements left. Y0-Y11 are scratch, handed out four at a time (but see
// bf16Zero); Y12 holds the scale factor and Y13-Y15 the bfloat16 rounding
// constants.
const factorReg = "Y12"

// regs is one group of scratch registers: a and b receive the operands and a
// the result; t and m are temporaries.
type regs struct{ a, b, t, m string }

func vregs(group int) regs {
	y := func(i int) string { return fmt.Sprintf("Y%d", 4*group+i) }
	return regs{y(0), y(1), y(2), y(3)}
}

// opFn emits code leaving r.a = r.a op r.b.
type opFn func(r regs) []string

// stepFn emits one step of a kernel; in and out are byte offsets from SI/DX
// and DI, slot says which unrolled copy this is, and nt asks for
// non-temporal stores (DI is then 32-byte aligned).
type stepFn func(slot, in, out int, nt bool) []string

func ins(op string, args ...string) string {
	if len(args) == 0 {
		return "\t" + op
	}
	return "\t" + op + "\t" + strings.Join(args, ", ")
}

func mem(off int, base string) string {
	if off == 0 {
		return "(" + base + ")"
	}
	return fmt.Sprintf("%d(%s)", off, base)
}

func simple(op string) opFn {
	return func(r regs) []string { return []string{ins(op, r.b, r.a, r.a)} }
}

// fmin ORs min(a,b) with min(b,a). VMINPx returns its second operand on
// ties and NaNs, so the pair holds both inputs exactly when they are
// unordered or ±0: the OR is then a NaN, or -0, whatever the argument order.
func fmin(sfx string) opFn {
	return func(r regs) []string {
		return []string{
			ins("VMINP"+sfx, r.a, r.b, r.t),
			ins("VMINP"+sfx, r.b, r.a, r.a),
			ins("VORP"+sfx, r.t, r.a, r.a),
		}
	}
}

// fmax ANDs max(a,b) with max(b,a), which turns {+0,-0} into +0, and then
// blends in a|b where the inputs are unordered, since the AND of a NaN and a
// number need not be a NaN.
func fmax(sfx string) opFn {
	return func(r regs) []string {
		return []string{
			ins("VMAXP"+sfx, r.b, r.a, r.t),
			ins("VMAXP"+sfx, r.a, r.b, r.m),
			ins("VANDP"+sfx, r.m, r.t, r.t),
			ins("VCMPP"+sfx, "$3", r.b, r.a, r.m),
			ins("VORP"+sfx, r.b, r.a, r.a),
			ins("VBLENDVP"+sfx, r.m, r.a, r.t, r.a),
		}
	}
}

// imin64 and imax64 stand in for VPMINSQ/VPMAXSQ, which need AVX-512.
func imin64(r regs) []string {
	return []string{ins("VPCMPGTQ", r.b, r.a, r.m), ins("VPBLENDVB", r.m, r.b, r.a, r.a)}
}

func imax64(r regs) []string {
	return []string{ins("VPCMPGTQ", r.b, r.a, r.m), ins("VPBLENDVB", r.m, r.a, r.b, r.a)}
}

func scaleBy(op string) opFn {
	return func(r regs) []string { return []string{ins(op, factorReg, r.a, r.a)} }
}

type loader func(reg, addr string) []string

// operands loads a (from SI) and, unless scaling, b (from DX).
func operands(r regs, load loader, off int, scale bool) []string {
	code := load(r.a, mem(off, "SI"))
	if !scale {
		code = append(code, load(r.b, mem(off, "DX"))...)
	}
	return code
}

func plainStep(mov string, op opFn, scale bool) stepFn {
	load := func(reg, addr string) []string { return []string{ins(mov, addr, reg)} }
	return func(slot, in, out int, nt bool) []string {
		r := vregs(slot % 3)
		code := operands(r, load, in, scale)
		code = append(code, op(r)...)
		return append(code, ins(store(mov, nt), r.a, mem(out, "DI")))
	}
}

func store(mov string, nt bool) string {
	if nt {
		return "VMOVNTDQ"
	}
	return mov
}

// xmm names the low half of a YMM register.
func xmm(y string) string { return "X" + y[1:] }

// f16Step widens eight binary16 values per source to float32, combines them
// and narrows with rounding mode 0, round to nearest even, whatever MXCSR
// says.
func f16Step(op opFn, scale bool) stepFn {
	load := func(reg, addr string) []string { return []string{ins("VCVTPH2PS", addr, reg)} }
	return func(slot, in, out int, nt bool) []string {
		r := vregs(slot % 3)
		code := operands(r, load, in, scale)
		code = append(code, op(r)...)
		if nt {
			// VCVTPS2PH has no streaming form: narrow in a register.
			return append(code,
				ins("VCVTPS2PH", "$0", r.a, xmm(r.a)),
				ins("VMOVNTDQ", xmm(r.a), mem(out, "DI")))
		}
		return append(code, ins("VCVTPS2PH", "$0", r.a, mem(out, "DI")))
	}
}

// bf16Step handles sixteen bfloat16 values as two float32 vectors, then
// rounds both and packs them into one 32-byte store. Interleaving words with
// zero widens bfloat16 to float32 in one instruction, but per 128-bit lane,
// so the vectors hold elements 0-3,8-11 and 4-7,12-15; element-wise ops do
// not care, and VPACKUSDW, also per lane, restores the order.
func bf16Step(op opFn, scale bool) stepFn {
	return func(slot, in, out int, nt bool) []string {
		var code []string
		for h, unpack := range []string{"VPUNPCKLWD", "VPUNPCKHWD"} {
			r := vregs(h)
			code = append(code, ins(unpack, mem(in, "SI"), bf16Zero, r.a))
			if !scale {
				code = append(code, ins(unpack, mem(in, "DX"), bf16Zero, r.b))
			}
			code = append(code, op(r)...)
			code = append(code, bf16Round(r)...)
		}
		lo, hi := vregs(0).a, vregs(1).a
		return append(code,
			ins("VPACKUSDW", hi, lo, lo),
			ins(store("VMOVDQU", nt), lo, mem(out, "DI")))
	}
}

// bf16Round leaves in r.a the bfloat16 bits of the float32s in r.a in the
// low half of each lane: add 0x7fff plus the lowest kept bit (round to
// nearest even), except that NaNs are only quieted, as half.F32ToBF16 does.
func bf16Round(r regs) []string {
	return []string{
		ins("VPSRLD", "$16", r.a, r.t),
		ins("VPAND", "Y13", r.t, r.t),
		ins("VPADDD", "Y14", r.t, r.t),
		ins("VPADDD", r.a, r.t, r.t),
		ins("VCMPPS", "$3", r.a, r.a, r.m),
		ins("VPOR", "Y15", r.a, r.a),
		ins("VBLENDVPS", r.m, r.a, r.t, r.a),
		ins("VPSRLD", "$16", r.a, r.a),
	}
}

// bf16Zero is free in bfloat16 kernels, whose steps use only register
// groups 0 and 1.
const bf16Zero = "Y11"

// bf16Consts sets Y11 = 0, Y13 = 1, Y14 = 0x7fff and Y15 = the float32
// quiet bit in every lane without touching memory.
var bf16Consts = []string{
	ins("VPXOR", bf16Zero, bf16Zero, bf16Zero),
	ins("VPCMPEQD", "Y13", "Y13", "Y13"),
	ins("VPSRLD", "$17", "Y13", "Y14"),
	ins("VPSRLD", "$31", "Y13", "Y13"),
	ins("VPSLLD", "$22", "Y13", "Y15"),
}

// kernel is one generated function. A step handles elems elements, reading
// in bytes from each source and writing out bytes; the main loop runs unroll
// steps per iteration and a second loop finishes whole steps one at a time.
type kernel struct {
	name   string
	params string // Go parameter list
	args   int    // argument frame size
	scale  bool
	stream bool // takes a stream flag selecting non-temporal stores
	elems  int
	in     int
	out    int
	unroll int
	setup  []string
	step   stepFn
}
