package transport_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/fuzzinput"
)

// Each fuzzer checks two properties on arbitrary input: decoding never panics
// and, when it succeeds, re-encoding gives back exactly the input (the formats
// have no slack); and a message built from the input's bytes survives an
// encode/decode round trip unchanged.

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []transport.Header{
		{Kind: transport.FrameData},
		{Kind: transport.FrameData, Sender: 3, JobID: transport.JobHash("job"), Epoch: 7, Seq: 99, Count: 1 << 20, Step: 4, Length: 4096, Coll: 1, DType: 2, Op: 3, Flags: 4, Aux: 5},
		{Kind: transport.FrameAbort, Length: transport.MaxAbortReason},
		{Kind: transport.FrameData, Length: transport.MaxPayload},
		{Kind: transport.FrameRekey, Length: transport.RekeyMsgSize},
		{Kind: transport.FrameLanes, Aux: 4},
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
			if h.Kind == transport.FrameLanes && (h.Length != 0 || h.Aux == 0) {
				t.Fatalf("decoded a lanes frame of %d bytes for %d lanes", h.Length, h.Aux)
			}
		} else {
			var fe *transport.FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("DecodeHeader error %v is not a *FrameError", err)
			}
		}

		// Build a valid header from the input and round-trip it.
		fs := fuzzinput.Fields{B: b}
		h = transport.Header{
			Kind: transport.FrameData, Sender: fs.U32(), JobID: fs.U64(), Epoch: fs.U64(), Seq: fs.U64(),
			Count: fs.U64(), Step: fs.U32(), Length: fs.U32() % (transport.MaxPayload + 1),
			Coll: fs.U8(), DType: fs.U8(), Op: fs.U8(), Flags: fs.U8(), Aux: fs.U32(),
		}
		switch fs.U8() % 4 {
		case 1:
			h.Kind, h.Length = transport.FrameAbort, h.Length%(transport.MaxAbortReason+1)
		case 2:
			h.Kind, h.Length = transport.FrameRekey, transport.RekeyMsgSize
		case 3:
			h.Kind, h.Length, h.Aux = transport.FrameLanes, 0, max(h.Aux, 1)
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

func FuzzDecodeRekey(f *testing.F) {
	w := transport.World{JobID: "job", Epoch: 9, Rank: 2, Addrs: []string{"a", "b", "c", "d"}}
	for _, m := range []transport.RekeyMsg{
		transport.NewRekeyMsg(w, 0, 0),
		transport.NewRekeyMsg(w, 3, 7),
		{Epoch: 1 << 62, Size: transport.MaxWorldSize, From: transport.MaxWorldSize - 1, To: 0},
	} {
		b := make([]byte, transport.RekeyMsgSize)
		m.Encode(b)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(make([]byte, transport.RekeyMsgSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m transport.RekeyMsg
		if err := transport.DecodeRekey(b, &m); err == nil {
			out := make([]byte, transport.RekeyMsgSize)
			m.Encode(out)
			if !bytes.Equal(out, b) {
				t.Fatalf("re-encoded rekey message differs:\n in %x\nout %x", b, out)
			}
			if m.Size == 0 || m.From >= m.Size || m.To >= m.Size || m.From == m.To {
				t.Fatalf("decoded a message with ranks %d, %d in a world of %d", m.From, m.To, m.Size)
			}
			// Its own mirror image passes CheckRekey; any change of the
			// epoch does not.
			mirror := m
			mirror.From, mirror.To = m.To, m.From
			if err := transport.CheckRekey(&mirror, &m); err != nil {
				t.Fatalf("CheckRekey of a message against its mirror: %v", err)
			}
			mirror.Epoch++
			if err := transport.CheckRekey(&mirror, &m); !errors.Is(err, transport.ErrRekey) {
				t.Fatalf("CheckRekey across epochs: %v, want ErrRekey", err)
			}
		}

		// Build a valid message from the input and round-trip it.
		fs := fuzzinput.Fields{B: b}
		m = transport.RekeyMsg{Epoch: fs.U64(), Size: 2 + fs.U32()%(transport.MaxWorldSize-1), Lane: fs.U32()}
		m.From, m.To = fs.U32()%m.Size, fs.U32()%m.Size
		if m.From == m.To {
			m.To = (m.From + 1) % m.Size
		}
		copy(m.Nonce[:], fs.Take(transport.RekeyNonceSize))
		copy(m.MAC[:], fs.Take(transport.RekeyMACSize))
		enc := make([]byte, transport.RekeyMsgSize)
		m.Encode(enc)
		var got transport.RekeyMsg
		if err := transport.DecodeRekey(enc, &got); err != nil {
			t.Fatalf("decode of an encoded valid message: %v", err)
		}
		if got != m {
			t.Fatalf("round trip: got %+v, want %+v", got, m)
		}
	})
}
