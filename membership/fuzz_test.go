package membership

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"testing"
)

// The fuzzers check that the decoders never panic on arbitrary input, that
// whatever they accept re-encodes to exactly the input (there is one encoding
// per value), and that values built from the input's bytes survive an
// encode/decode round trip. The seed corpus lives in testdata/fuzz.

func FuzzMetaDecode(f *testing.F) {
	for _, m := range []Meta{
		validMeta(),
		{JobID: "j", Role: RoleDriver, State: StateJoining, GPUs: GPUsUnknown, StartedAt: 1},
		{JobID: "job", Role: RoleWorker, State: StateLeaving, StartedAt: 1 << 62, CollectiveAddr: "[::1]:9", Extra: map[string]string{"a": "", "b": "c"}},
	} {
		b, err := m.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{metaVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if err := m.UnmarshalBinary(b); err == nil {
			out, err := m.MarshalBinary()
			if err != nil {
				t.Fatalf("decoded %+v does not re-encode: %v", m, err)
			}
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
			}
		}

		// Build a Meta from the input's bytes; when it encodes, it must decode
		// to itself.
		fs := fuzzFields{b}
		in := Meta{
			Role: Role(fs.u8() % 3), State: State(fs.u8() % 4),
			StartedAt: int64(fs.u64() >> 1), GPUs: int(int16(fs.u16())),
			JobID: fs.str(), CollectiveAddr: fs.str(), Host: fs.str(),
		}
		for range fs.u8() % 4 {
			if in.Extra == nil {
				in.Extra = map[string]string{}
			}
			in.Extra[fs.str()] = fs.str()
		}
		enc, err := in.MarshalBinary()
		if err != nil {
			return
		}
		if len(enc) > MaxMetaSize {
			t.Fatalf("encoded %d bytes, over the limit", len(enc))
		}
		var got Meta
		if err := got.UnmarshalBinary(enc); err != nil {
			t.Fatalf("decoding an encoded valid Meta: %v", err)
		}
		if !got.Equal(in) {
			t.Fatalf("round trip:\n in %+v\nout %+v", in, got)
		}
	})
}

func FuzzFrameDecode(f *testing.F) {
	for _, fr := range []frame{
		{kind: frameData, jobID: "job", from: "host-1-abc", seq: 1, payload: []byte("proposal")},
		{kind: frameData, jobID: "j", from: "n", seq: 1 << 40, payload: nil},
		{kind: frameBye, jobID: "job", from: "host-2-def", seq: 7},
	} {
		fr.sig = make([]byte, frameSigSize)
		f.Add(appendFrame(nil, &fr))
	}
	f.Add([]byte("gm"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr frame
		if verifyFrame(fuzzKey.Public().(ed25519.PublicKey), "to", b) {
			t.Fatalf("arbitrary bytes %x verified", b)
		}
		if err := decodeFrame(b, &fr); err == nil {
			if out := appendFrame(nil, &fr); !bytes.Equal(out, b) {
				t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
			}
			if frameSize(&fr) != len(b) {
				t.Fatalf("frameSize %d, encoded %d", frameSize(&fr), len(b))
			}
		}
		fs := fuzzFields{b}
		in := frame{kind: frameData, jobID: fs.str(), from: fs.str(), seq: fs.u64(), sig: fs.take(frameSigSize), payload: fs.b}
		if in.jobID == "" || in.from == "" || in.seq == 0 {
			return
		}
		var got frame
		if err := decodeFrame(appendFrame(nil, &in), &got); err != nil {
			t.Fatalf("decoding an encoded valid frame: %v", err)
		}
		if got.jobID != in.jobID || got.from != in.from || got.seq != in.seq || !bytes.Equal(got.payload, in.payload) || !bytes.Equal(got.sig, in.sig) {
			t.Fatalf("round trip: in %+v out %+v", in, got)
		}
		// Signed for one receiver, it verifies there and nowhere else, and
		// with no other key.
		signed := signFrame(fuzzKey, "to", &in)
		if err := decodeFrame(signed, &got); err != nil {
			t.Fatalf("decoding a signed frame: %v", err)
		}
		pub := fuzzKey.Public().(ed25519.PublicKey)
		if !verifyFrame(pub, "to", signed) || verifyFrame(pub, "other", signed) || verifyFrame(otherKey, "to", signed) {
			t.Fatal("a signature verified for the wrong receiver or key, or not for the right one")
		}
	})
}

// fuzzKey signs the fuzzer's frames; otherKey is another member's public key.
var (
	fuzzKey  = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	otherKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, ed25519.SeedSize)).Public().(ed25519.PublicKey)
)

// fuzzFields hands out values from fuzz input, zero once it runs out.
type fuzzFields struct{ b []byte }

func (f *fuzzFields) take(n int) []byte {
	out := make([]byte, n)
	k := copy(out, f.b)
	f.b = f.b[k:]
	return out
}
func (f *fuzzFields) u8() uint8   { return f.take(1)[0] }
func (f *fuzzFields) u16() uint16 { return binary.LittleEndian.Uint16(f.take(2)) }
func (f *fuzzFields) u64() uint64 { return binary.LittleEndian.Uint64(f.take(8)) }
func (f *fuzzFields) str() string { return string(f.take(int(f.u8()) % 64)) }

// FuzzOpenMeta: sealed metadata from the network (an alive message's
// NodeMeta, a frameMeta) never panics the opener, and what it accepts is a
// valid Meta whose seal, over the member's name, the encoding and the
// sequence number it returns, verifies under the key the Meta publishes.
func FuzzOpenMeta(f *testing.F) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		f.Fatal(err)
	}
	m := validMeta()
	m.SigningKey = pub
	enc, err := m.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	good := sealMeta(priv, "node-a", enc, 7)
	f.Add(good, "node-a")
	f.Add(good, "node-b")
	f.Add(good[:len(good)-1], "node-a")
	f.Add([]byte{}, "node-a")
	f.Add(enc, "node-a")
	f.Fuzz(func(t *testing.T, b []byte, name string) {
		mem := &Member{auth: map[string]*peerAuth{}}
		meta, seq, err := mem.openMeta(name, b)
		if err != nil {
			return
		}
		if err := meta.Validate(); err != nil {
			t.Fatalf("accepted metadata that does not validate: %v", err)
		}
		unsealed := b[:len(b)-ed25519.SignatureSize]
		if !ed25519.Verify(meta.SigningKey, metaSigned(name, unsealed), b[len(b)-ed25519.SignatureSize:]) {
			t.Fatal("accepted a seal that does not verify")
		}
		if got := binary.LittleEndian.Uint64(unsealed[len(unsealed)-8:]); got != seq {
			t.Fatalf("sequence number %d, the bytes say %d", seq, got)
		}
	})
}
