// gorovod's element-wise device kernels: reduce (sum, prod, min, max), scale
// and integer divide, for float32, float64, float16, bfloat16, int32, int64 and
// uint8. They implement exactly the semantics of the host kernels in
// internal/reduce (see that package's doc and the kernels package doc), so a
// collective gives the same bits whether a chunk was reduced on the host or on
// a GPU. The only deliberate difference: a Sum, Prod or Scale whose result is
// NaN carries the GPU's canonical NaN rather than the x86 payload.
//
// This file is compiled by NVRTC to kernels.ptx (go generate in this
// directory); the default-build tests also compile it as plain C++ on the host
// and compare every kernel with internal/reduce, so it uses no CUDA headers,
// no intrinsics and nothing from the C++ library except rint.
//
// Every kernel parameter is 8 bytes wide (pointers, u64 counts, double
// factors, i64 divisors) because gorgonia.org/cu's Launch copies 8 bytes per
// parameter.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define GOROVOD_FN static __device__ __forceinline__

// Bit casts through a union: valid CUDA C++ and well defined in GCC, so the
// host check compiles the same code.
GOROVOD_FN u32 f32_bits(float f) {
    union { float f; u32 u; } v;
    v.f = f;
    return v.u;
}

GOROVOD_FN float f32_from(u32 u) {
    union { float f; u32 u; } v;
    v.u = u;
    return v.f;
}

GOROVOD_FN u64 f64_bits(double f) {
    union { double f; u64 u; } v;
    v.f = f;
    return v.u;
}

GOROVOD_FN double f64_from(u64 u) {
    union { double f; u64 u; } v;
    v.u = u;
    return v.f;
}

// ---- 16-bit conversions: internal/half, bit for bit (not the hardware cvt,
// whose NaN payloads differ).

// f16_to_f32 widens binary16 exactly; signalling NaNs are quieted.
GOROVOD_FN float f16_to_f32(u16 h) {
    u32 sign = (u32)(h & 0x8000u) << 16;
    u32 exp = ((u32)h >> 10) & 0x1fu;
    u32 mant = (u32)h & 0x3ffu;
    if (exp == 0x1fu && mant != 0) {
        return f32_from(sign | 0x7f800000u | 0x00400000u | mant << 13);
    }
    if (exp == 0x1fu) {
        return f32_from(sign | 0x7f800000u);
    }
    if (exp != 0) {
        return f32_from(sign | (exp + 127u - 15u) << 23 | mant << 13);
    }
    // Zero or subnormal: mant * 2^-24 is exact in float32.
    float v = (float)mant * 5.9604644775390625e-8f;
    return f32_from(sign | f32_bits(v));
}

// round_shift returns x >> s rounded to nearest, ties to even (s in 1..31).
GOROVOD_FN u32 round_shift(u32 x, u32 s) {
    u32 q = x >> s;
    u32 rem = x & ((1u << s) - 1u);
    u32 half = 1u << (s - 1u);
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
        q++;
    }
    return q;
}

// f32_to_f16 narrows to binary16, rounding to nearest even, overflowing to
// infinity, keeping the top NaN payload bits (quiet).
GOROVOD_FN u16 f32_to_f16(float f) {
    u32 b = f32_bits(f);
    u16 sign = (u16)((b >> 16) & 0x8000u);
    i32 exp = (i32)((b >> 23) & 0xffu);
    u32 mant = b & 0x7fffffu;
    if (exp == 0xff) {
        if (mant != 0) {
            return (u16)(sign | 0x7c00u | 0x0200u | (mant >> 13));
        }
        return (u16)(sign | 0x7c00u);
    }
    i32 e = exp - 127 + 15;
    if (e >= 0x1f) {
        return (u16)(sign | 0x7c00u);
    }
    if (e <= 0) {
        // Below 2^-25 everything rounds to zero, float32 subnormals too.
        if (e < -10 || exp == 0) {
            return sign;
        }
        return (u16)(sign | round_shift(mant | 0x800000u, (u32)(14 - e)));
    }
    // A carry out of the mantissa bumps the exponent, up to infinity.
    return (u16)(sign | round_shift((u32)e << 23 | mant, 13));
}

GOROVOD_FN float bf16_to_f32(u16 h) { return f32_from((u32)h << 16); }

// f32_to_bf16 rounds to nearest even; NaNs are truncated and quieted, since
// rounding could carry them into infinity.
GOROVOD_FN u16 f32_to_bf16(float f) {
    u32 b = f32_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((b >> 16) | 0x0040u);
    }
    return (u16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// ---- Symmetric, NaN-propagating min and max. Equal inputs can differ only
// as +0/-0, where OR gives -0 (min) and AND gives +0 (max); unordered inputs
// OR into a NaN, whichever side it was on.

GOROVOD_FN float min_f32(float x, float y) {
    if (x < y) return x;
    if (y < x) return y;
    return f32_from(f32_bits(x) | f32_bits(y));
}

GOROVOD_FN float max_f32(float x, float y) {
    if (x > y) return x;
    if (y > x) return y;
    if (x == y) return f32_from(f32_bits(x) & f32_bits(y));
    return f32_from(f32_bits(x) | f32_bits(y));
}

GOROVOD_FN double min_f64(double x, double y) {
    if (x < y) return x;
    if (y < x) return y;
    return f64_from(f64_bits(x) | f64_bits(y));
}

GOROVOD_FN double max_f64(double x, double y) {
    if (x > y) return x;
    if (y > x) return y;
    if (x == y) return f64_from(f64_bits(x) & f64_bits(y));
    return f64_from(f64_bits(x) | f64_bits(y));
}

// ---- Element functions, one per (op, type). Integer sum and product wrap:
// they are computed in the unsigned type, where C++ defines overflow.

GOROVOD_FN float sum_float32(float a, float b) { return a + b; }
GOROVOD_FN float prod_float32(float a, float b) { return a * b; }
GOROVOD_FN float min_float32(float a, float b) { return min_f32(a, b); }
GOROVOD_FN float max_float32(float a, float b) { return max_f32(a, b); }

GOROVOD_FN double sum_float64(double a, double b) { return a + b; }
GOROVOD_FN double prod_float64(double a, double b) { return a * b; }
GOROVOD_FN double min_float64(double a, double b) { return min_f64(a, b); }
GOROVOD_FN double max_float64(double a, double b) { return max_f64(a, b); }

// 16-bit floats: widen, combine in float32, round once.
#define GOROVOD_HALF_OPS(T, TO32, FROM32)                                                          \
    GOROVOD_FN u16 sum_##T(u16 a, u16 b) { return FROM32(TO32(a) + TO32(b)); }                   \
    GOROVOD_FN u16 prod_##T(u16 a, u16 b) { return FROM32(TO32(a) * TO32(b)); }                  \
    GOROVOD_FN u16 min_##T(u16 a, u16 b) { return FROM32(min_f32(TO32(a), TO32(b))); }           \
    GOROVOD_FN u16 max_##T(u16 a, u16 b) { return FROM32(max_f32(TO32(a), TO32(b))); }

GOROVOD_HALF_OPS(float16, f16_to_f32, f32_to_f16)
GOROVOD_HALF_OPS(bfloat16, bf16_to_f32, f32_to_bf16)

#define GOROVOD_INT_OPS(T, S, U)                                                                   \
    GOROVOD_FN S sum_##T(S a, S b) { return (S)(U)((U)a + (U)b); }                                \
    GOROVOD_FN S prod_##T(S a, S b) { return (S)(U)((U)a * (U)b); }                               \
    GOROVOD_FN S min_##T(S a, S b) { return a < b ? a : b; }                                      \
    GOROVOD_FN S max_##T(S a, S b) { return a > b ? a : b; }

GOROVOD_INT_OPS(int32, i32, u32)
GOROVOD_INT_OPS(int64, i64, u64)
GOROVOD_INT_OPS(uint8, u8, u32)

// ---- Integer scaling: the product in double, rounded to nearest even (rint
// in the default rounding mode), saturated to the type's range; NaN gives 0.

GOROVOD_FN i32 sat_int32(double v) {
    v = rint(v);
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return -2147483647 - 1;
    if (v != v) return 0;
    return (i32)v;
}

GOROVOD_FN i64 sat_int64(double v) {
    v = rint(v);
    if (v >= 9223372036854775808.0) return 9223372036854775807LL;
    if (v <= -9223372036854775808.0) return -9223372036854775807LL - 1;
    if (v != v) return 0;
    return (i64)v;
}

GOROVOD_FN u8 sat_uint8(double v) {
    v = rint(v);
    if (v >= 255.0) return 255;
    if (v > 0.0) return (u8)v;
    return 0; // negative, zero or NaN
}

// ---- Kernels. A grid-stride loop, so any grid covers any n; each thread
// reads its operands before writing, so dst may be a or b itself.

#define GOROVOD_LOOP(n)                                                                            \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                           \
         i += (u64)blockDim.x * gridDim.x)

#define GOROVOD_REDUCE(OP, T, S)                                                                   \
    extern "C" __global__ void gorovod_##OP##_##T(S *dst, const S *a, const S *b, u64 n) {       \
        GOROVOD_LOOP(n) { dst[i] = OP##_##T(a[i], b[i]); }                                        \
    }

#define GOROVOD_REDUCE_ALL(T, S)                                                                   \
    GOROVOD_REDUCE(sum, T, S)                                                                      \
    GOROVOD_REDUCE(prod, T, S)                                                                     \
    GOROVOD_REDUCE(min, T, S)                                                                      \
    GOROVOD_REDUCE(max, T, S)

GOROVOD_REDUCE_ALL(float32, float)
GOROVOD_REDUCE_ALL(float64, double)
GOROVOD_REDUCE_ALL(float16, u16)
GOROVOD_REDUCE_ALL(bfloat16, u16)
GOROVOD_REDUCE_ALL(int32, i32)
GOROVOD_REDUCE_ALL(int64, i64)
GOROVOD_REDUCE_ALL(uint8, u8)

// Scale kernels: x[i] *= f. float32 and the 16-bit types scale in float32 with
// f rounded to float32 first; float64 in double; integers as above.

extern "C" __global__ void gorovod_scale_float32(float *x, u64 n, double f) {
    float g = (float)f;
    GOROVOD_LOOP(n) { x[i] = x[i] * g; }
}

extern "C" __global__ void gorovod_scale_float64(double *x, u64 n, double f) {
    GOROVOD_LOOP(n) { x[i] = x[i] * f; }
}

extern "C" __global__ void gorovod_scale_float16(u16 *x, u64 n, double f) {
    float g = (float)f;
    GOROVOD_LOOP(n) { x[i] = f32_to_f16(f16_to_f32(x[i]) * g); }
}

extern "C" __global__ void gorovod_scale_bfloat16(u16 *x, u64 n, double f) {
    float g = (float)f;
    GOROVOD_LOOP(n) { x[i] = f32_to_bf16(bf16_to_f32(x[i]) * g); }
}

extern "C" __global__ void gorovod_scale_int32(i32 *x, u64 n, double f) {
    GOROVOD_LOOP(n) { x[i] = sat_int32((double)x[i] * f); }
}

// int64 elements are rounded to double first, as on the host.
extern "C" __global__ void gorovod_scale_int64(i64 *x, u64 n, double f) {
    GOROVOD_LOOP(n) { x[i] = sat_int64((double)x[i] * f); }
}

extern "C" __global__ void gorovod_scale_uint8(u8 *x, u64 n, double f) {
    GOROVOD_LOOP(n) { x[i] = sat_uint8((double)x[i] * f); }
}

// Divide kernels (Average on integers): the quotient in int64, truncated
// toward zero, converted to the element type by wrapping. d is never 0 (the
// caller checks); MinInt64 / -1 wraps to MinInt64 as in Go instead of being
// undefined.

extern "C" __global__ void gorovod_div_int32(i32 *x, u64 n, i64 d) {
    GOROVOD_LOOP(n) { x[i] = (i32)(u32)(u64)((i64)x[i] / d); }
}

extern "C" __global__ void gorovod_div_int64(i64 *x, u64 n, i64 d) {
    GOROVOD_LOOP(n) {
        if (d == -1) {
            x[i] = (i64)(0ULL - (u64)x[i]);
        } else {
            x[i] = x[i] / d;
        }
    }
}

extern "C" __global__ void gorovod_div_uint8(u8 *x, u64 n, i64 d) {
    GOROVOD_LOOP(n) { x[i] = (u8)(u64)((i64)x[i] / d); }
}
