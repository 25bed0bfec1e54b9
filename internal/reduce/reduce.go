package reduce

import "strconv"

// Op is a reduction operation.
type Op uint8

// The reduction operations. Integer Sum and Prod wrap around.
const (
	Sum Op = iota
	Prod
	Min
	Max
)

var opNames = [...]string{Sum: "Sum", Prod: "Prod", Min: "Min", Max: "Max"}

func (op Op) String() string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return "Op(" + strconv.Itoa(int(op)) + ")"
}

func badOp(op Op) string { return "reduce: invalid " + op.String() }

// The binary kernels set dst[i] = a[i] op b[i] for i < len(dst); a and b
// must be at least as long as dst. dst may be a or b itself, but must not
// partially overlap either.

// Float32 combines float32 buffers.
func Float32(op Op, dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := float32Vec(op, dst, a, b)
	float32Go(op, dst[k:], a[k:], b[k:])
}

// Float64 combines float64 buffers.
func Float64(op Op, dst, a, b []float64) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := float64Vec(op, dst, a, b)
	float64Go(op, dst[k:], a[k:], b[k:])
}

// Float16 combines IEEE binary16 buffers given as raw bits, computing in
// float32 and rounding each result once to nearest even.
func Float16(op Op, dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := float16Vec(op, dst, a, b)
	float16Go(op, dst[k:], a[k:], b[k:])
}

// BFloat16 combines bfloat16 buffers given as raw bits, computing in float32
// and rounding each result once to nearest even.
func BFloat16(op Op, dst, a, b []uint16) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := bfloat16Vec(op, dst, a, b)
	bfloat16Go(op, dst[k:], a[k:], b[k:])
}

// Int32 combines int32 buffers.
func Int32(op Op, dst, a, b []int32) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := int32Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
}

// Int64 combines int64 buffers.
func Int64(op Op, dst, a, b []int64) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := int64Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
}

// Uint8 combines uint8 buffers.
func Uint8(op Op, dst, a, b []uint8) {
	a, b = a[:len(dst)], b[:len(dst)]
	k := uint8Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
}
