package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
)

// Frame header layout, little-endian, HeaderSize bytes:
//
//	0  magic   uint16  'G','V'
//	2  version uint8
//	3  kind    uint8   FrameData or FrameAbort
//	4  sender  uint32  rank of the sender
//	8  job     uint64  JobHash of the job id
//	16 epoch   uint64
//	24 seq     uint64  collective sequence number on the communicator
//	32 count   uint64  element count of the whole collective (mismatch check)
//	40 step    uint32  step / chunk index inside the collective
//	44 length  uint32  payload bytes that follow
//	48 coll    uint8   collective kind
//	49 dtype   uint8
//	50 op      uint8   reduce op
//	51 flags   uint8
//	52 aux     uint32  collective-specific (root rank, layout hash)
//	56 tag     uint64  a value the collective carries along (see Header.Tag)
const HeaderSize = 64

// Magic opens every frame.
const Magic uint16 = 'G' | 'V'<<8

// Version is the frame format version; frames of any other version are rejected.
const Version uint8 = 2

// MaxPayload bounds one frame's payload so a corrupt length can never make a
// receiver allocate or wait for gigabytes.
const MaxPayload = 1 << 30

// MaxAbortReason bounds the reason text carried by an abort frame.
const MaxAbortReason = 4096

// FrameKind tells data frames from control frames.
type FrameKind uint8

const (
	// FrameData carries collective payload.
	FrameData FrameKind = 1
	// FrameAbort says the sender gave up on the communicator; its payload is the
	// reason as UTF-8 text (at most MaxAbortReason bytes).
	FrameAbort FrameKind = 2
	// FrameRekey moves a link into the next world: its payload is a
	// RekeyMsg (RekeyMsgSize bytes). See RekeyableLink.
	FrameRekey FrameKind = 3
	// FrameLanes is a link's own: it says how many of the link's
	// connections carry the data frames that follow it in this direction
	// (Aux, at least 1; no payload). A transport that stripes frames over
	// several connections sends and consumes it; no Link returns it.
	FrameLanes FrameKind = 4
)

func (k FrameKind) String() string {
	switch k {
	case FrameData:
		return "data"
	case FrameAbort:
		return "abort"
	case FrameRekey:
		return "rekey"
	case FrameLanes:
		return "lanes"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Header is the fixed-size prefix of every frame.
type Header struct {
	Kind   FrameKind
	Sender uint32
	JobID  uint64
	Epoch  uint64
	Seq    uint64
	Count  uint64
	Step   uint32
	Length uint32
	Coll   uint8
	DType  uint8
	Op     uint8
	Flags  uint8
	Aux    uint32
	// Tag is not checked by anyone: collectives use it to spread a small value
	// (the highest membership epoch a rank knows of) along with their data, so
	// that agreeing on it costs no message of its own.
	Tag uint64
}

// JobHash maps a job id to the 64-bit value frames carry.
func JobHash(jobID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(jobID))
	return h.Sum64()
}

// Encode writes h into b, which must hold at least HeaderSize bytes.
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], Magic)
	b[2] = Version
	b[3] = uint8(h.Kind)
	binary.LittleEndian.PutUint32(b[4:], h.Sender)
	binary.LittleEndian.PutUint64(b[8:], h.JobID)
	binary.LittleEndian.PutUint64(b[16:], h.Epoch)
	binary.LittleEndian.PutUint64(b[24:], h.Seq)
	binary.LittleEndian.PutUint64(b[32:], h.Count)
	binary.LittleEndian.PutUint32(b[40:], h.Step)
	binary.LittleEndian.PutUint32(b[44:], h.Length)
	b[48] = h.Coll
	b[49] = h.DType
	b[50] = h.Op
	b[51] = h.Flags
	binary.LittleEndian.PutUint32(b[52:], h.Aux)
	binary.LittleEndian.PutUint64(b[56:], h.Tag)
}

// DecodeHeader parses a header and checks what is independent of any world:
// size, magic, version, kind and payload bounds.
func DecodeHeader(b []byte, h *Header) error {
	if len(b) < HeaderSize {
		return &FrameError{Peer: -1, Reason: fmt.Sprintf("short header: %d bytes, want %d", len(b), HeaderSize)}
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != Magic {
		return &FrameError{Peer: -1, Reason: fmt.Sprintf("bad magic %#04x", m)}
	}
	if v := b[2]; v != Version {
		return &FrameError{Peer: -1, Reason: fmt.Sprintf("unsupported frame version %d (want %d)", v, Version)}
	}
	*h = Header{
		Kind:   FrameKind(b[3]),
		Sender: binary.LittleEndian.Uint32(b[4:]),
		JobID:  binary.LittleEndian.Uint64(b[8:]),
		Epoch:  binary.LittleEndian.Uint64(b[16:]),
		Seq:    binary.LittleEndian.Uint64(b[24:]),
		Count:  binary.LittleEndian.Uint64(b[32:]),
		Step:   binary.LittleEndian.Uint32(b[40:]),
		Length: binary.LittleEndian.Uint32(b[44:]),
		Coll:   b[48],
		DType:  b[49],
		Op:     b[50],
		Flags:  b[51],
		Aux:    binary.LittleEndian.Uint32(b[52:]),
		Tag:    binary.LittleEndian.Uint64(b[56:]),
	}
	switch h.Kind {
	case FrameData:
		if h.Length > MaxPayload {
			return &FrameError{Peer: -1, Reason: fmt.Sprintf("payload length %d over the limit %d", h.Length, MaxPayload)}
		}
	case FrameAbort:
		if h.Length > MaxAbortReason {
			return &FrameError{Peer: -1, Reason: fmt.Sprintf("abort reason of %d bytes over the limit %d", h.Length, MaxAbortReason)}
		}
	case FrameRekey:
		if h.Length != RekeyMsgSize {
			return &FrameError{Peer: -1, Reason: fmt.Sprintf("rekey frame of %d bytes, want %d", h.Length, RekeyMsgSize)}
		}
	case FrameLanes:
		if h.Length != 0 || h.Aux == 0 {
			return &FrameError{Peer: -1, Reason: fmt.Sprintf("lanes frame of %d bytes for %d lanes, want 0 bytes for at least 1", h.Length, h.Aux)}
		}
	default:
		return &FrameError{Peer: -1, Reason: fmt.Sprintf("unknown frame kind %d", uint8(h.Kind))}
	}
	return nil
}

// DecodeFrom is what a link does with every header it receives: DecodeHeader,
// with a FrameError naming peer, then CheckOrigin.
func DecodeFrom(b []byte, h *Header, jobHash, epoch uint64, peer int) error {
	if err := DecodeHeader(b, h); err != nil {
		var fe *FrameError
		if errors.As(err, &fe) {
			fe.Peer = peer
		}
		return err
	}
	return CheckOrigin(h, jobHash, epoch, peer)
}

// CheckOrigin verifies that a decoded header belongs to world w and comes from
// rank peer. Transports call it on every received header.
func CheckOrigin(h *Header, jobHash, epoch uint64, peer int) error {
	if h.JobID != jobHash {
		return &FrameError{Peer: peer, Reason: fmt.Sprintf("frame for another job (%#x, want %#x)", h.JobID, jobHash)}
	}
	if h.Epoch != epoch {
		return &FrameError{Peer: peer, Reason: fmt.Sprintf("frame from epoch %d, this world is epoch %d", h.Epoch, epoch)}
	}
	if int64(h.Sender) != int64(peer) {
		return &FrameError{Peer: peer, Reason: fmt.Sprintf("frame claims sender rank %d on the link to rank %d", h.Sender, peer)}
	}
	return nil
}

// CheckOutgoing checks a frame a link is asked to send: its header's length
// matches the payload, and the payload is within its kind's limit. Every
// transport's Send runs it first, so a bad frame fails the same way on each.
func CheckOutgoing(h *Header, payload []byte) error {
	if int64(h.Length) != int64(len(payload)) {
		return fmt.Errorf("header length %d != payload length %d", h.Length, len(payload))
	}
	switch h.Kind {
	case FrameData:
		if len(payload) > MaxPayload {
			return fmt.Errorf("payload of %d bytes over the limit %d", len(payload), MaxPayload)
		}
	case FrameAbort:
		if len(payload) > MaxAbortReason {
			return fmt.Errorf("abort reason of %d bytes over the limit %d", len(payload), MaxAbortReason)
		}
	case FrameRekey:
		if len(payload) != RekeyMsgSize {
			return fmt.Errorf("rekey frame of %d bytes, want %d", len(payload), RekeyMsgSize)
		}
	case FrameLanes:
		if len(payload) != 0 || h.Aux == 0 {
			return fmt.Errorf("lanes frame of %d bytes for %d lanes, want 0 bytes for at least 1", len(payload), h.Aux)
		}
	default:
		return fmt.Errorf("unknown frame kind %d", uint8(h.Kind))
	}
	return nil
}
