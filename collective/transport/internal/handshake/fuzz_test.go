package handshake_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/fuzzinput"
	"github.com/gorovod/gorovod/collective/transport/internal/handshake"
)

// Each fuzzer checks two properties on arbitrary input: decoding never panics
// and, when it succeeds, re-encoding gives back exactly the input (the formats
// have no slack); and a message built from the input's bytes survives an
// encode/decode round trip unchanged.

func FuzzDecodeHello(f *testing.F) {
	for _, h := range []handshake.Hello{
		{JobHash: transport.JobHash("job"), Epoch: 5, From: 1, To: 0, Size: 2, Security: transport.SecurityPlain, Nonce: [32]byte{1, 2, 3}},
		{JobHash: 1, Epoch: 1 << 60, From: 7, To: 3, Size: 8, Security: transport.SecurityAuthenticated},
		{From: 0, To: transport.MaxWorldSize - 1, Size: transport.MaxWorldSize, Security: transport.SecurityEncrypted},
	} {
		b := make([]byte, handshake.HelloSize)
		h.Encode(b)
		f.Add(b)
	}
	f.Add(make([]byte, handshake.HelloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h handshake.Hello
		if err := handshake.DecodeHello(b, &h); err == nil {
			out := make([]byte, handshake.HelloSize)
			h.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded hello differs:\n in %x\nout %x", b, out)
			}
			if h.Size < 2 || h.From >= h.Size || h.To >= h.Size || h.From == h.To ||
				h.Security == transport.SecurityDefault || !h.Security.Valid() ||
				h.Lanes < 1 || h.Lanes > handshake.MaxLanes || h.Lane >= h.Lanes {
				t.Fatalf("decoded an impossible hello %+v", h)
			}
		} else {
			checkHandshakeError(t, err)
		}

		fs := fuzzinput.Fields{B: b}
		h = handshake.Hello{JobHash: fs.U64(), Epoch: fs.U64(), Size: 2 + fs.U32()%(transport.MaxWorldSize-1)}
		h.From = fs.U32() % h.Size
		h.To = (h.From + 1 + fs.U32()%(h.Size-1)) % h.Size
		h.Security = transport.SecurityPlain + transport.Security(fs.U8()%3)
		h.Lanes = 1 + fs.U8()%handshake.MaxLanes
		h.Lane = fs.U8() % h.Lanes
		copy(h.Nonce[:], fs.Take(handshake.NonceSize))
		enc := make([]byte, handshake.HelloSize)
		h.Encode(enc)
		var got handshake.Hello
		if err := handshake.DecodeHello(enc, &got); err != nil {
			t.Fatalf("decode of an encoded valid hello %+v: %v", h, err)
		}
		if got != h {
			t.Fatalf("round trip: got %+v, want %+v", got, h)
		}
	})
}

func FuzzDecodeChallenge(f *testing.F) {
	for _, c := range []handshake.Challenge{
		{Status: handshake.StatusOK, Nonce: [32]byte{9}, MAC: [32]byte{8, 7}},
		{Status: handshake.RejectStaleEpoch, Reason: "stale epoch: epoch 4 is older than epoch 5 connected here"},
		{Status: handshake.RejectNotReady},
		{Status: handshake.RejectWrongJob, Reason: string(bytes.Repeat([]byte("x"), handshake.MaxRejectReason))},
	} {
		b := make([]byte, handshake.ChallengeSize)
		c.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var c handshake.Challenge
		if err := handshake.DecodeChallenge(b, &c); err == nil {
			out := make([]byte, handshake.ChallengeSize)
			c.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded challenge differs:\n in %x\nout %x", b, out)
			}
			checkReason(t, c.Reason)
		} else {
			checkHandshakeError(t, err)
		}

		fs := fuzzinput.Fields{B: b}
		c = handshake.Challenge{Status: handshake.Status(fs.U8() % 10)}
		if c.Status == handshake.StatusOK {
			copy(c.Nonce[:], fs.Take(handshake.NonceSize))
			copy(c.MAC[:], fs.Take(handshake.MACSize))
		} else {
			c.Reason = fs.Str(255) // may be too long or hold control bytes: Encode sanitizes
		}
		enc := make([]byte, handshake.ChallengeSize)
		c.Encode(enc)
		var got handshake.Challenge
		if err := handshake.DecodeChallenge(enc, &got); err != nil {
			t.Fatalf("decode of an encoded challenge %+v: %v", c, err)
		}
		if got.Status != c.Status || got.Nonce != c.Nonce || got.MAC != c.MAC || !sanitized(got.Reason, c.Reason) {
			t.Fatalf("round trip: got %+v, want %+v", got, c)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	r := handshake.Response{MAC: [32]byte{1, 2, 3, 4}}
	b := make([]byte, handshake.ResponseSize)
	r.Encode(b)
	f.Add(b)
	f.Add(b[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		var r handshake.Response
		if err := handshake.DecodeResponse(b, &r); err == nil {
			out := make([]byte, handshake.ResponseSize)
			r.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded response differs:\n in %x\nout %x", b, out)
			}
		} else {
			checkHandshakeError(t, err)
		}

		fs := fuzzinput.Fields{B: b}
		copy(r.MAC[:], fs.Take(handshake.MACSize))
		enc := make([]byte, handshake.ResponseSize)
		r.Encode(enc)
		var got handshake.Response
		if err := handshake.DecodeResponse(enc, &got); err != nil || got != r {
			t.Fatalf("round trip: got %+v, %v; want %+v", got, err, r)
		}
	})
}

func FuzzDecodeVerdict(f *testing.F) {
	for _, v := range []handshake.Verdict{
		{Status: handshake.StatusOK},
		{Status: handshake.RejectWrongSecret, Reason: "your proof did not verify (secrets differ?)"},
		{Status: handshake.RejectBusy, Reason: "too many connections waiting"},
	} {
		b := make([]byte, handshake.VerdictSize)
		v.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v handshake.Verdict
		if err := handshake.DecodeVerdict(b, &v); err == nil {
			out := make([]byte, handshake.VerdictSize)
			v.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded verdict differs:\n in %x\nout %x", b, out)
			}
			checkReason(t, v.Reason)
		} else {
			checkHandshakeError(t, err)
		}

		fs := fuzzinput.Fields{B: b}
		v = handshake.Verdict{Status: handshake.Status(fs.U8() % 10)}
		if v.Status != handshake.StatusOK {
			v.Reason = fs.Str(255)
		}
		enc := make([]byte, handshake.VerdictSize)
		v.Encode(enc)
		var got handshake.Verdict
		if err := handshake.DecodeVerdict(enc, &got); err != nil {
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
	if len(r) > handshake.MaxRejectReason {
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
	if len(want) > handshake.MaxRejectReason {
		want = want[:handshake.MaxRejectReason]
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
