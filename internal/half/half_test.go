package half

import (
	"math"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
)

// refF16ToF32 decodes binary16 with float64 arithmetic, independently of
// the bit shuffling in F16ToF32.
func refF16ToF32(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch {
	case exp == 0x1f && mant == 0:
		return math.Inf(int(sign))
	case exp == 0x1f:
		return math.NaN()
	case exp == 0:
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1+mant/1024, exp-15)
}

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got := F16ToF32(h)
		want := refF16ToF32(h)
		if math.IsNaN(want) {
			// Quieted, sign and top payload kept, as VCVTPH2PS does.
			wantBits := uint32(h&0x8000)<<16 | 0x7fc00000 | uint32(h&0x3ff)<<13
			if math.Float32bits(got) != wantBits {
				t.Fatalf("F16ToF32(%#04x) = %#08x, want %#08x", h, math.Float32bits(got), wantBits)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(float32(want)) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
	}
}

func TestF16RoundTripExhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		want := h
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			want = h | 0x200
		}
		if got := F32ToF16(F16ToF32(h)); got != want {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x, want %#04x", h, got, want)
		}
	}
}

func TestBF16Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		want := h
		if h&0x7f80 == 0x7f80 && h&0x7f != 0 {
			want = h | 0x40
		}
		if got := F32ToBF16(f); got != want {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x, want %#04x", h, got, want)
		}
	}
}

func TestF32ToF16Cases(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{1 + 0x1p-11, 0x3c00},           // tie, even stays
		{1 + 3*0x1p-11, 0x3c02},         // tie, odd rounds up
		{1 + 0x1p-11 + 0x1p-23, 0x3c01}, // just above tie
		{-(1 + 3*0x1p-11), 0xbc02},
		{65504, 0x7bff},
		{65519.996, 0x7bff},
		{65520, 0x7c00}, // tie between max and 2^16 goes to even: Inf
		{-65520, 0xfc00},
		{1e10, 0x7c00},
		{float32(math.Inf(1)), 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{0x1p-14, 0x0400},           // smallest normal
		{0x1p-14 - 0x1p-25, 0x0400}, // tie between largest subnormal and smallest normal
		{0x1p-14 - 0x1p-24, 0x03ff}, // largest subnormal
		{0x1p-24, 0x0001},           // smallest subnormal
		{0x1p-25, 0x0000},           // tie with zero goes to even: zero
		{0x1p-25 + 0x1p-48, 0x0001}, // just above the tie
		{3 * 0x1p-25, 0x0002},       // tie between 1 and 2 ulps
		{5 * 0x1p-25, 0x0002},       // tie between 2 and 3 ulps
		{-0x1p-24, 0x8001},
		{-0x1p-26, 0x8000},
		{0x1p-149, 0x0000}, // float32 subnormal
		{float32(math.Float32frombits(0x7f800001)), 0x7e00},
		{float32(math.Float32frombits(0xffc12345)), 0xfe09},
	}
	for _, c := range cases {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", c.in, math.Float32bits(c.in), got, c.want)
		}
	}
}

func TestF32ToBF16Cases(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80},
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81},
		{0x7f7fffff, 0x7f80}, // overflow to Inf
		{0x7f7f7fff, 0x7f7f},
		{0xff7fffff, 0xff80},
		{0x00000001, 0x0000},
		{0x00008000, 0x0000}, // subnormal tie goes to even zero
		{0x00018000, 0x0002},
		{0x7f800000, 0x7f80},
		{0x7f800001, 0x7fc0}, // signalling NaN: quieted, not rounded to Inf
		{0xffffffff, 0xffff},
	}
	for _, c := range cases {
		if got := F32ToBF16(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
}

// table lists the values of the non-negative bit patterns of a 16-bit
// format in order, including the pattern of +Inf, which stands for the first
// value past the largest finite one (2^16 or 2^128). Nearest-value search over
// it is an independent definition of round-to-nearest-even.
type table struct {
	vals []float64
	inf  uint16
}

func newTable(inf uint16, decode func(uint16) float64, next float64) table {
	vals := make([]float64, inf+1)
	for h := uint16(0); h < inf; h++ {
		vals[h] = decode(h)
	}
	vals[inf] = next
	return table{vals, inf}
}

// round returns the bits nearest to f, with ties to the even pattern.
func (tb table) round(f float32) uint16 {
	if math.IsNaN(float64(f)) {
		panic("round: NaN")
	}
	sign := uint16(0)
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	x := math.Abs(float64(f))
	i := sort.SearchFloat64s(tb.vals, x)
	if i > int(tb.inf) {
		return sign | tb.inf
	}
	if tb.vals[i] == x || i == 0 {
		return sign | uint16(i)
	}
	lo, hi := big.NewFloat(tb.vals[i-1]), big.NewFloat(tb.vals[i])
	xb := big.NewFloat(x)
	dlo := new(big.Float).Sub(xb, lo)
	dhi := new(big.Float).Sub(hi, xb)
	switch c := dlo.Cmp(dhi); {
	case c < 0, c == 0 && (i-1)%2 == 0:
		return sign | uint16(i-1)
	}
	return sign | uint16(i)
}

var (
	f16Table  = newTable(0x7c00, refF16ToF32, 0x1p16)
	bf16Table = newTable(0x7f80, func(h uint16) float64 { return float64(BF16ToF32(h)) }, 0x1p128)
)

// randFloat32s yields values spread over all exponents, values concentrated
// in the target format's range, and values next to its rounding ties.
func randFloat32s(r *rand.Rand, n int, decode func(uint16) float32) []float32 {
	out := make([]float32, 0, n)
	for len(out) < n {
		var f float32
		switch r.IntN(3) {
		case 0:
			f = math.Float32frombits(r.Uint32())
		case 1:
			f = math.Float32frombits(r.Uint32()&0x80ffffff | uint32(100+r.IntN(48))<<23)
		default:
			// A 16-bit value plus half an ulp of it, nudged by a few
			// float32 ulps.
			h := uint16(r.Uint32())
			lo, hi := decode(h&^1), decode(h|1)
			mid := math.Float32bits((lo + hi) / 2)
			f = math.Float32frombits(mid + uint32(r.IntN(5)) - 2)
		}
		if !math.IsNaN(float64(f)) {
			out = append(out, f)
		}
	}
	return out
}

func TestF32ToF16Random(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 200000
	if testing.Short() {
		n = 20000
	}
	for _, f := range randFloat32s(r, n, F16ToF32) {
		if got, want := F32ToF16(f), f16Table.round(f); got != want {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestF32ToBF16Random(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	n := 200000
	if testing.Short() {
		n = 20000
	}
	for _, f := range randFloat32s(r, n, BF16ToF32) {
		if got, want := F32ToBF16(f), bf16Table.round(f); got != want {
			t.Fatalf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestNaNStaysNaN(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 100000; i++ {
		b := r.Uint32() | 0x7f800000
		if b&0x7fffff == 0 {
			continue
		}
		f := math.Float32frombits(b)
		if h := F32ToF16(f); h&0x7e00 != 0x7e00 || h>>15 != uint16(b>>31) {
			t.Fatalf("F32ToF16(%#08x) = %#04x, not a quiet NaN of the same sign", b, h)
		}
		if h := F32ToBF16(f); h&0x7fc0 != 0x7fc0 || h>>15 != uint16(b>>31) {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, not a quiet NaN of the same sign", b, h)
		}
	}
}

func BenchmarkF32ToF16(b *testing.B) {
	var s uint16
	for i := 0; i < b.N; i++ {
		s += F32ToF16(float32(i) * 0.37)
	}
	sink = s
}

func BenchmarkF16ToF32(b *testing.B) {
	var s float32
	for i := 0; i < b.N; i++ {
		s += F16ToF32(uint16(i))
	}
	sink = uint16(s)
}

var sink uint16
