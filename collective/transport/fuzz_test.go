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

func FuzzDecodeHello(f *testing.F) {
	for _, h := range []transport.Hello{
		{JobHash: transport.JobHash("job"), Epoch: 5, From: 1, To: 0, Size: 2, Nonce: [32]byte{1, 2, 3}},
		{JobHash: 1, Epoch: 1 << 60, From: 7, To: 3, Size: 8},
		{From: 0, To: transport.MaxWorldSize - 1, Size: transport.MaxWorldSize},
	} {
		b := make([]byte, transport.HelloSize)
		h.Encode(b)
		f.Add(b)
	}
	f.Add(make([]byte, transport.HelloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h transport.Hello
		if err := transport.DecodeHello(b, &h); err == nil {
			out := make([]byte, transport.HelloSize)
			h.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded hello differs:\n in %x\nout %x", b, out)
			}
			if h.Size < 2 || h.From >= h.Size || h.To >= h.Size || h.From == h.To {
				t.Fatalf("decoded an impossible hello %+v", h)
			}
		} else {
			checkHandshakeError(t, err)
		}

		fs := fields{b}
		h = transport.Hello{JobHash: fs.u64(), Epoch: fs.u64(), Size: 2 + fs.u32()%(transport.MaxWorldSize-1)}
		h.From = fs.u32() % h.Size
		h.To = (h.From + 1 + fs.u32()%(h.Size-1)) % h.Size
		copy(h.Nonce[:], fs.take(transport.NonceSize))
		enc := make([]byte, transport.HelloSize)
		h.Encode(enc)
		var got transport.Hello
		if err := transport.DecodeHello(enc, &got); err != nil {
			t.Fatalf("decode of an encoded valid hello %+v: %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	for _, c := range []transport.Challenge{
		{Status: transport.StatusOK, Nonce: [32]byte{9}, MAC: [32]byte{8, 7}},
		{Status: transport.RejectStaleEpoch, Reason: "stale epoch: epoch 4 is older than epoch 5 connected here"},
		{Status: transport.RejectNotReady},
		{Status: transport.RejectWrongJob, Reason: string(bytes.Repeat([]byte("x"), transport.MaxRejectReason))},
	} {
		b := make([]byte, transport.ChallengeSize)
		c.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c transport.Challenge
		if err := transport.DecodeChallenge(b, &c); err == nil {
			out := make([]byte, transport.ChallengeSize)
			c.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded challenge differs:\n in %x\nout %x", b, out)
			}
			checkReason(t, c.Reason)
		} else {
			checkHandshakeError(t, err)
		}

		fs := fields{b}
		c = transport.Challenge{Status: transport.HandshakeStatus(fs.u8() % 10)}
		if c.Status == transport.StatusOK {
			copy(c.Nonce[:], fs.take(transport.NonceSize))
			copy(c.MAC[:], fs.take(transport.MACSize))
		} else {
			c.Reason = fs.str(255) // may be too long or hold control bytes: Encode sanitizes
		}
		enc := make([]byte, transport.ChallengeSize)
		c.Encode(enc)
		var got transport.Challenge
		if err := transport.DecodeChallenge(enc, &got); err != nil {
			t.Fatalf("decode of an encoded challenge %+v: %v", c, err)
		}
		if got.Status != c.Status || got.Nonce != c.Nonce || got.MAC != c.MAC || !sanitized(got.Reason, c.Reason) {
			t.Fatalf("round trip: got %+v, want %+v", got, c)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	r := transport.Response{MAC: [32]byte{1, 2, 3, 4}}
	b := make([]byte, transport.ResponseSize)
	r.Encode(b)
	f.Add(b)
	f.Add(b[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		var r transport.Response
		if err := transport.DecodeResponse(b, &r); err == nil {
			out := make([]byte, transport.ResponseSize)
			r.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded response differs:\n in %x\nout %x", b, out)
			}
		} else {
			checkHandshakeError(t, err)
		}

		fs := fields{b}
		copy(r.MAC[:], fs.take(transport.MACSize))
		enc := make([]byte, transport.ResponseSize)
		r.Encode(enc)
		var got transport.Response
		if err := transport.DecodeResponse(enc, &got); err != nil || got != r {
			t.Fatalf("round trip: got %+v, %v; want %+v", got, err, r)
		}
	})
}

func FuzzDecodeVerdict(f *testing.F) {
	for _, v := range []transport.Verdict{
		{Status: transport.StatusOK},
		{Status: transport.RejectWrongSecret, Reason: "your proof did not verify (secrets differ?)"},
		{Status: transport.RejectBusy, Reason: "too many connections waiting"},
	} {
		b := make([]byte, transport.VerdictSize)
		v.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v transport.Verdict
		if err := transport.DecodeVerdict(b, &v); err == nil {
			out := make([]byte, transport.VerdictSize)
			v.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded verdict differs:\n in %x\nout %x", b, out)
			}
			checkReason(t, v.Reason)
		} else {
			checkHandshakeError(t, err)
		}

		fs := fields{b}
		v = transport.Verdict{Status: transport.HandshakeStatus(fs.u8() % 10)}
		if v.Status != transport.StatusOK {
			v.Reason = fs.str(255)
		}
		enc := make([]byte, transport.VerdictSize)
		v.Encode(enc)
		var got transport.Verdict
		if err := transport.DecodeVerdict(enc, &got); err != nil {
			t.Fatalf("decode of an encoded verdict %+v: %v", v, err)
		}
		if got.Status != v.Status || !sanitized(got.Reason, v.Reason) {
			t.Fatalf("round trip: got %+v, want %+v", got, v)
		}
	})
}

func checkHandshakeError(t *testing.T, err error) {
	t.Helper()
	var he *transport.HandshakeError
	if !errors.As(err, &he) || !he.Fatal {
		t.Fatalf("decode error %v (%T) is not a fatal *HandshakeError", err, err)
	}
}

func checkReason(t *testing.T, r string) {
	t.Helper()
	if len(r) > transport.MaxRejectReason {
		t.Fatalf("reason of %d bytes", len(r))
	}
	for i := 0; i < len(r); i++ {
		if r[i] < 0x20 || r[i] > 0x7e {
			t.Fatalf("reason %q holds a non-printable byte", r)
		}
	}
}

// sanitized reports whether got is want as Encode sends it: truncated, with
// every byte outside printable ASCII replaced by '?'.
func sanitized(got, want string) bool {
	if len(want) > transport.MaxRejectReason {
		want = want[:transport.MaxRejectReason]
	}
	if len(got) != len(want) {
		return false
	}
	for i := 0; i < len(want); i++ {
		c := want[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		if got[i] != c {
			return false
		}
	}
	return true
}
