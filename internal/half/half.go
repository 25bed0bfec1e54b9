package half

import "math"

const (
	f16SignMask = 0x8000
	f16ExpMask  = 0x7c00
	f16Quiet    = 0x0200
	f32Quiet    = 0x00400000
	bf16Quiet   = 0x0040
)

// F16ToF32 widens binary16 bits to float32. Every binary16 value is exactly
// representable; signalling NaNs are quieted, as VCVTPH2PS does.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&f16SignMask) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f && mant != 0:
		return math.Float32frombits(sign | 0x7f800000 | f32Quiet | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000)
	case exp != 0:
		// Rebias the exponent from 15 to 127.
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
	// Zero or subnormal: mant * 2^-24 is exact in float32.
	v := float32(mant) * 0x1p-24
	return math.Float32frombits(sign | math.Float32bits(v))
}

// F32ToF16 narrows f to binary16 bits, rounding to nearest even.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & f16SignMask
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			// Keep the top payload bits, like VCVTPS2PH.
			return sign | f16ExpMask | f16Quiet | uint16(mant>>13)
		}
		return sign | f16ExpMask
	}
	e := exp - 127 + 15
	switch {
	case e >= 0x1f:
		return sign | f16ExpMask
	case e <= 0:
		return sign | f16Subnormal(mant, e, exp)
	}
	// A carry out of the mantissa correctly bumps the exponent, and from
	// the largest finite value on to infinity.
	return sign | uint16(roundShift(uint32(e)<<23|mant, 13))
}

// f16Subnormal rounds a float32 magnitude whose binary16 exponent e is <= 0
// to a binary16 subnormal (or to the smallest normal when it rounds up).
func f16Subnormal(mant uint32, e, exp int32) uint16 {
	// Below 2^-25 everything rounds to zero; this also covers float32
	// subnormals (exp == 0), which lack the implicit bit.
	if e < -10 || exp == 0 {
		return 0
	}
	return uint16(roundShift(mant|0x800000, uint(14-e)))
}

// roundShift returns x >> s rounded to nearest, ties to even. s must be in
// 1..31.
func roundShift(x uint32, s uint) uint32 {
	q := x >> s
	rem := x & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return q
}

// BF16ToF32 widens bfloat16 bits to float32; it is exact and keeps NaN
// payloads unchanged.
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 narrows f to bfloat16 bits, rounding to nearest even. NaNs are
// truncated and quieted, since rounding could carry them into infinity.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | bf16Quiet
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
