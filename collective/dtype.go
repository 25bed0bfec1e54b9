package collective

import (
	"fmt"

	"github.com/gorovod/gorovod/internal/half"
)

// DType is the element type of a collective's buffers.
type DType uint8

// The element types every collective supports. The zero DType is invalid so that a
// forgotten field is caught.
const (
	Float32 DType = iota + 1
	Float64
	Float16  // IEEE 754 binary16
	BFloat16 // bfloat16 (8-bit exponent, 7-bit mantissa)
	Int32
	Int64
	Uint8
)

// Size is the number of bytes of one element, 0 for an invalid DType.
func (d DType) Size() int {
	switch d {
	case Float32, Int32:
		return 4
	case Float64, Int64:
		return 8
	case Float16, BFloat16:
		return 2
	case Uint8:
		return 1
	}
	return 0
}

// Valid reports whether d is one of the supported element types.
func (d DType) Valid() bool { return d.Size() != 0 }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float32 || d == Float64 || d == Float16 || d == BFloat16
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Uint8:
		return "uint8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType is the inverse of DType.String.
func ParseDType(s string) (DType, error) {
	for d := Float32; d <= Uint8; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("collective: unknown dtype %q (want float32, float64, float16, bfloat16, int32, int64 or uint8)", s)
}

// ReduceOp combines the contributions of all ranks: element by element, or,
// for Adasum, tensor by tensor.
type ReduceOp uint8

// The reduce operations. Average is Sum followed by a division by the world size
// (folded into the postscale factor for floating-point types; integer division,
// truncating toward zero, for integer types). Adasum is Horovod's adaptive
// summation (see Communicator.Allreduce): allreduce only, floating-point
// types only, a power-of-two number of ranks.
const (
	Sum ReduceOp = iota + 1
	Average
	Min
	Max
	Product
	Adasum
)

// Valid reports whether op is one of the supported reduce operations.
func (op ReduceOp) Valid() bool { return op >= Sum && op <= Adasum }

func unknownOp(op ReduceOp) error {
	return fmt.Errorf("collective: reduce op %d unknown (want sum, average, min, max, product or adasum)", uint8(op))
}

// Elementwise reports whether op combines the ranks' values element by
// element (every op but Adasum), which reduce-scatter needs.
func (op ReduceOp) Elementwise() bool { return op.Valid() && op != Adasum }

func (op ReduceOp) String() string {
	switch op {
	case Sum:
		return "sum"
	case Average:
		return "average"
	case Min:
		return "min"
	case Max:
		return "max"
	case Product:
		return "product"
	case Adasum:
		return "adasum"
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// ParseReduceOp is the inverse of ReduceOp.String.
func ParseReduceOp(s string) (ReduceOp, error) {
	for op := Sum; op <= Adasum; op++ {
		if op.String() == s {
			return op, nil
		}
	}
	return 0, fmt.Errorf("collective: unknown reduce op %q (want sum, average, min, max, product or adasum)", s)
}

// F16 is an IEEE 754 binary16 element (DType Float16), stored as its bits.
type F16 uint16

// NewF16 rounds f to the nearest binary16 value (ties to even).
func NewF16(f float32) F16 { return F16(half.F32ToF16(f)) }

// Float32 widens h exactly.
func (h F16) Float32() float32 { return half.F16ToF32(uint16(h)) }

func (h F16) String() string { return fmt.Sprint(h.Float32()) }

// BF16 is a bfloat16 element (DType BFloat16), stored as its bits.
type BF16 uint16

// NewBF16 rounds f to the nearest bfloat16 value (ties to even).
func NewBF16(f float32) BF16 { return BF16(half.F32ToBF16(f)) }

// Float32 widens b exactly.
func (b BF16) Float32() float32 { return half.BF16ToF32(uint16(b)) }

func (b BF16) String() string { return fmt.Sprint(b.Float32()) }

// Element is the set of Go types the typed API accepts, one per DType.
type Element interface {
	float32 | float64 | F16 | BF16 | int32 | int64 | uint8
}

// DTypeOf returns the DType of T.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case F16:
		return Float16
	case BF16:
		return BFloat16
	case int32:
		return Int32
	case int64:
		return Int64
	case uint8:
		return Uint8
	}
	return 0
}
