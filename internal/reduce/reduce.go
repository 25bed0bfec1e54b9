package reduce

import (
	"errors"
	"fmt"
	"strconv"
)

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

// ErrUnknownOp is wrapped by the error a binary kernel returns for an Op
// other than Sum, Prod, Min and Max.
var ErrUnknownOp = errors.New("reduce: unknown op")

// unknownOp is the error for an op above Max. The exported binary kernels
// test for that once per call, before touching any element, so the kernels
// below them never meet one.
func unknownOp(op Op) error { return fmt.Errorf("%w %d", ErrUnknownOp, uint8(op)) }

// The binary kernels set dst[i] = a[i] op b[i] for i < len(dst); a and b
// must be at least as long as dst. dst may be a or b itself, but must not
// partially overlap either. For an unknown op they return an error wrapping
// ErrUnknownOp and leave dst untouched.

// Float32 combines float32 buffers.
func Float32(op Op, dst, a, b []float32) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := float32Vec(op, dst, a, b)
	float32Go(op, dst[k:], a[k:], b[k:])
	return nil
}

// Float64 combines float64 buffers.
func Float64(op Op, dst, a, b []float64) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := float64Vec(op, dst, a, b)
	float64Go(op, dst[k:], a[k:], b[k:])
	return nil
}

// Float16 combines IEEE binary16 buffers given as raw bits, computing in
// float32 and rounding each result once to nearest even.
func Float16(op Op, dst, a, b []uint16) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := float16Vec(op, dst, a, b)
	float16Go(op, dst[k:], a[k:], b[k:])
	return nil
}

// BFloat16 combines bfloat16 buffers given as raw bits, computing in float32
// and rounding each result once to nearest even.
func BFloat16(op Op, dst, a, b []uint16) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := bfloat16Vec(op, dst, a, b)
	bfloat16Go(op, dst[k:], a[k:], b[k:])
	return nil
}

// Int32 combines int32 buffers.
func Int32(op Op, dst, a, b []int32) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := int32Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
	return nil
}

// Int64 combines int64 buffers.
func Int64(op Op, dst, a, b []int64) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := int64Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
	return nil
}

// Uint8 combines uint8 buffers.
func Uint8(op Op, dst, a, b []uint8) error {
	if op > Max {
		return unknownOp(op)
	}
	a, b = a[:len(dst)], b[:len(dst)]
	k := uint8Vec(op, dst, a, b)
	intGo(op, dst[k:], a[k:], b[k:])
	return nil
}
