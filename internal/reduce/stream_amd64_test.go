package reduce

import (
	"testing"
	"unsafe"
)

// streamed runs the kernels with non-temporal stores on buffers far below
// streamBytes, aligning dst the way streamHead does.
func streamed[T any](asm func(Op, []T, []T, []T, bool) int, ref func(Op, []T, []T, []T)) binaryFn[T] {
	return func(op Op, dst, a, b []T) error {
		h := 0
		if len(dst) > 0 {
			h = int(-uintptr(unsafe.Pointer(&dst[0]))%32) / int(unsafe.Sizeof(dst[0]))
			h = min(h, len(dst))
		}
		ref(op, dst[:h], a, b)
		k := h + asm(op, dst[h:], a[h:], b[h:], true)
		ref(op, dst[k:], a[k:], b[k:])
		return nil
	}
}

func TestStreamingKernels(t *testing.T) {
	if !hasAVX2 || !hasF16C {
		t.Skip("needs AVX2 and F16C")
	}
	checkBinary(t, f32Kind, streamed(float32Asm, float32Go), goKernel(float32Go), allOps...)
	checkBinary(t, f64Kind, streamed(float64Asm, float64Go), goKernel(float64Go), allOps...)
	checkBinary(t, f16Kind, streamed(float16Asm, float16Go), goKernel(float16Go), allOps...)
	checkBinary(t, bf16Kind, streamed(bfloat16Asm, bfloat16Go), goKernel(bfloat16Go), allOps...)
	checkBinary(t, i32Kind, streamed(int32Asm, intGo[int32]), goKernel(intGo[int32]), allOps...)
	checkBinary(t, i64Kind, streamed(int64Asm, intGo[int64]), goKernel(intGo[int64]), allOps...)
	checkBinary(t, u8Kind, streamed(uint8Asm, intGo[uint8]), goKernel(intGo[uint8]), allOps...)
}

// TestStreamingPath goes through the public API above the threshold, with a
// misaligned dst so streamHead has to peel elements off.
func TestStreamingPath(t *testing.T) {
	n := streamBytes/2 + 13
	buf := make([]uint16, n+1)
	dst := buf[1:]
	a, b := make([]uint16, n), make([]uint16, n)
	for i := range a {
		a[i], b[i] = uint16(i*7), uint16(i*13)
	}
	if h, s := streamHead(dst, a, b); !s || h == 0 {
		t.Fatalf("streamHead = %d, %v; want a peeled, streamed dst", h, s)
	}
	if _, s := streamHead(a, a, b); s {
		t.Error("in-place dst streamed")
	}
	want := make([]uint16, n)
	float16Go(Max, want, a, b)
	if err := Float16(Max, dst, a, b); err != nil {
		t.Fatal(err)
	}
	if err := firstDiff(f16Kind, Max, dst, want); err != nil {
		t.Fatal(err)
	}
	if buf[0] != 0 {
		t.Error("wrote before dst")
	}
}
