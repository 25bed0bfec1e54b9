package transport_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
)

// Each fuzzer checks two properties on arbitrary input: decoding never panics
// and, when it succeeds, re-encoding gives back exactly the input (the formats
// have no slack); and a message built from the input's bytes survives an
// encode/decode round trip unchanged.

// fields hands out fixed-size values from fuzz input, zero once it runs out.
type fields struct{ b []byte }

func (f *fields) take(n int) []byte {
	out := make([]byte, n)
	k := copy(out, f.b)
	f.b = f.b[k:]
	return out
}
func (f *fields) u8() uint8   { return f.take(1)[0] }
func (f *fields) u32() uint32 { return binary.LittleEndian.Uint32(f.take(4)) }
func (f *fields) u64() uint64 { return binary.LittleEndian.Uint64(f.take(8)) }
func (f *fields) str(max int) string {
	n := int(f.u8()) % (max + 1)
	return string(f.take(n))
}

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []transport.Header{
		{Kind: transport.FrameData},
		{Kind: transport.FrameData, Sender: 3, JobID: transport.JobHash("job"), Epoch: 7, Seq: 99, Count: 1 << 20, Step: 4, Length: 4096, Coll: 1, DType: 2, Op: 3, Flags: 4, Aux: 5},
		{Kind: transport.FrameAbort, Length: transport.MaxAbortReason},
		{Kind: transport.FrameData, Length: transport.MaxPayload},
	} {
		b := make([]byte, transport.HeaderSize)
		h.Encode(b)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("GV"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h transport.Header
		if err := transport.DecodeHeader(b, &h); err == nil {
			out := make([]byte, transport.HeaderSize)
			h.Encode(out)
			if !bytes.Equal(out, b[:transport.HeaderSize]) {
				t.Fatalf("re-encoded header differs:\n in %x\nout %x", b[:transport.HeaderSize], out)
			}
			if err := transport.CheckOrigin(&h, h.JobID, h.Epoch, int(h.Sender)); err != nil {
				t.Fatalf("CheckOrigin against its own fields: %v", err)
			}
		} else {
			var fe *transport.FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("DecodeHeader error %v is not a *FrameError", err)
			}
		}

		// Build a valid header from the input and round-trip it.
		fs := fields{b}
		h = transport.Header{
			Kind: transport.FrameData, Sender: fs.u32(), JobID: fs.u64(), Epoch: fs.u64(), Seq: fs.u64(),
			Count: fs.u64(), Step: fs.u32(), Length: fs.u32() % (transport.MaxPayload + 1),
			Coll: fs.u8(), DType: fs.u8(), Op: fs.u8(), Flags: fs.u8(), Aux: fs.u32(),
		}
		if fs.u8()&1 == 1 {
			h.Kind, h.Length = transport.FrameAbort, h.Length%(transport.MaxAbortReason+1)
		}
		enc := make([]byte, transport.HeaderSize)
		h.Encode(enc)
		var got transport.Header
		if err := transport.DecodeHeader(enc, &got); err != nil {
			t.Fatalf("decode of an encoded valid header: %v", err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
	})
}
