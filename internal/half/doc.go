// Package half owns the conversions between float32 and the two 16-bit
// floating-point formats that travel through gorovod's collectives:
// IEEE-754 binary16 ("float16") and bfloat16. Values are passed as raw
// uint16 bit patterns so callers can reinterpret wire buffers without copies.
//
// Narrowing conversions round to nearest, ties to even, overflow to
// infinity, and keep NaNs NaN (quiet). The results match what x86 F16C
// (VCVTPH2PS / VCVTPS2PH with rounding mode 0) produces, bit for bit,
// including NaN payloads, so that assembly kernels and pure-Go fallbacks
// elsewhere in gorovod agree exactly.
package half
