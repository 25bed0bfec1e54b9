package fuzzinput

import "encoding/binary"

// Fields takes values from the front of B, each zero once B runs out.
type Fields struct{ B []byte }

// Take returns the next n bytes (zero-padded past the end of the input).
func (f *Fields) Take(n int) []byte {
	out := make([]byte, n)
	k := copy(out, f.B)
	f.B = f.B[k:]
	return out
}

func (f *Fields) U8() uint8   { return f.Take(1)[0] }
func (f *Fields) U32() uint32 { return binary.LittleEndian.Uint32(f.Take(4)) }
func (f *Fields) U64() uint64 { return binary.LittleEndian.Uint64(f.Take(8)) }

// Str is a string of up to max bytes, its length taken from the input.
func (f *Fields) Str(max int) string {
	n := int(f.U8()) % (max + 1)
	return string(f.Take(n))
}
