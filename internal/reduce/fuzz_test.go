package reduce

import (
	"encoding/binary"
	"testing"
)

// FuzzFloat16 feeds arbitrary bit patterns, lengths and offsets to the
// 16-bit kernels and holds the vector path to the pure-Go one.
func FuzzFloat16(f *testing.F) {
	f.Add([]byte{0x00, 0x3c, 0x00, 0xbc}, uint8(0), uint8(0))
	f.Add([]byte{0x01, 0x7c, 0x00, 0x80, 0x00, 0x00, 0xff, 0x7b, 0xff, 0x7b}, uint8(2), uint8(1))
	f.Add(make([]byte, 130), uint8(3), uint8(5))
	f.Fuzz(func(t *testing.T, data []byte, op, off uint8) {
		n := len(data) / 4
		a, b := make([]uint16, n), make([]uint16, n)
		for i := range n {
			a[i] = binary.LittleEndian.Uint16(data[4*i:])
			b[i] = binary.LittleEndian.Uint16(data[4*i+2:])
		}
		o := Op(op % 4)
		k := int(off) % (n + 1)
		a, b = at(k%8, a[k:]), b[k:]
		for _, c := range []struct {
			kind      kind[uint16]
			fast, ref binaryFn[uint16]
		}{{f16Kind, Float16, goKernel(float16Go)}, {bf16Kind, BFloat16, goKernel(bfloat16Go)}} {
			got, want := make([]uint16, len(a)), make([]uint16, len(a))
			if err := c.fast(o, got, a, b); err != nil {
				t.Fatalf("%s %v: %v", c.kind.name, o, err)
			}
			_ = c.ref(o, want, a, b)
			if err := firstDiff(c.kind, o, got, want); err != nil {
				t.Fatalf("%s %v: %v", c.kind.name, o, err)
			}
		}
		got, want := make([]uint16, len(a)), make([]uint16, len(a))
		scale := float32(int(op)-128) / 7
		ScaleFloat16(got, a, float64(scale))
		scaleFloat16Go(want, a, scale)
		if err := firstDiff(f16Kind, Prod, got, want); err != nil {
			t.Fatalf("ScaleFloat16 by %v: %v", scale, err)
		}
	})
}
