package reduce

import "errors"

// The scale kernels set dst[i] = src[i] * f for i < len(dst); src must be
// at least as long as dst and may be dst itself.

// ScaleFloat32 scales in float32, with f rounded to float32 first.
func ScaleFloat32(dst, src []float32, f float64) {
	src = src[:len(dst)]
	k := scaleFloat32Vec(dst, src, float32(f))
	scaleFloatGo(dst[k:], src[k:], float32(f))
}

// ScaleFloat64 scales in float64.
func ScaleFloat64(dst, src []float64, f float64) {
	src = src[:len(dst)]
	k := scaleFloat64Vec(dst, src, f)
	scaleFloatGo(dst[k:], src[k:], f)
}

// ScaleFloat16 scales binary16 bits in float32, with f rounded to float32
// first, and rounds each result once to nearest even.
func ScaleFloat16(dst, src []uint16, f float64) {
	src = src[:len(dst)]
	k := scaleFloat16Vec(dst, src, float32(f))
	scaleFloat16Go(dst[k:], src[k:], float32(f))
}

// ScaleBFloat16 scales bfloat16 bits in float32, with f rounded to float32
// first, and rounds each result once to nearest even.
func ScaleBFloat16(dst, src []uint16, f float64) {
	src = src[:len(dst)]
	k := scaleBFloat16Vec(dst, src, float32(f))
	scaleBFloat16Go(dst[k:], src[k:], float32(f))
}

// The integer scale kernels compute src[i] * f in float64, round to
// nearest (ties to even) and saturate to the element type's range; a NaN
// product (f is NaN, or infinite and src[i] is 0) gives 0.

// ScaleInt32 scales int32 elements.
func ScaleInt32(dst, src []int32, f float64) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = toInt32(float64(src[i]) * f)
	}
}

// ScaleInt64 scales int64 elements; src[i] is first rounded to float64.
func ScaleInt64(dst, src []int64, f float64) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = toInt64(float64(src[i]) * f)
	}
}

// ScaleUint8 scales uint8 elements.
func ScaleUint8(dst, src []uint8, f float64) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = toUint8(float64(src[i]) * f)
	}
}

// The division kernels set dst[i] = src[i] / d, truncating toward zero,
// for Average on integer types. The quotient is computed in int64 and
// converted to the element type with Go's wrapping conversion (so
// MinInt32 / -1 is MinInt32, and a negative d wraps uint8 results). For d
// 0 they return ErrDivideByZero and leave dst untouched.

// ErrDivideByZero is the division kernels' error for a divisor of 0.
var ErrDivideByZero = errors.New("reduce: integer division by zero")

// DivInt32 divides int32 elements.
func DivInt32(dst, src []int32, d int64) error {
	if d == 0 {
		return ErrDivideByZero
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = int32(int64(src[i]) / d)
	}
	return nil
}

// DivInt64 divides int64 elements.
func DivInt64(dst, src []int64, d int64) error {
	if d == 0 {
		return ErrDivideByZero
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] / d
	}
	return nil
}

// DivUint8 divides uint8 elements.
func DivUint8(dst, src []uint8, d int64) error {
	if d == 0 {
		return ErrDivideByZero
	}
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = uint8(int64(src[i]) / d)
	}
	return nil
}
