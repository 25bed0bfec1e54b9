package membership

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Message is a payload another member sent with Send.
type Message struct {
	// From is the sender as known here. When the sender's alive message has not
	// reached this member yet, only From.Name is set.
	From Node
	// Payload is the sender's bytes; the receiver owns them.
	Payload []byte
	// At is when the message arrived.
	At time.Time
}

// Frame of every user message this package puts on memberlist's reliable
// channel:
//
//	0 magic   "gm"
//	2 version uint8 = 2
//	3 kind    uint8 (frameData, frameBye, frameMeta, frameReach)
//	4 job     uint8 length + JobID
//	  from    uint8 length + sender name
//	  seq     uint64, little-endian: the sender's count of frames to this
//	          receiver, from 1
//	  payload the rest but the signature (empty for frameBye and
//	          frameReach; the sender's encoded Meta for frameMeta)
//	  sig     64 bytes: Ed25519, by the sender's SigningKey, over
//	          signatureLabel, the receiver's name (uint8 length + name) and
//	          every byte of the frame before sig
//
// memberlist's NotifyMsg does not say who sent a message, and every member
// holds the gossip key, so the name in a frame proves nothing by itself: the
// signature binds it to the key the named member published when it joined
// (see peerAuth), the receiver's name in the signed bytes keeps a frame for
// one member from being accepted by another, and the sequence number keeps
// a frame from being accepted twice. The job id rides in every frame
// because a member of another job that shares the secret could otherwise
// inject messages.
const (
	frameMagic0, frameMagic1 = 'g', 'm'
	frameVersion             = 2
	frameData                = 1
	// frameBye tells a peer that the sender is leaving gracefully, so its
	// coming death is reported as Left rather than Failed.
	frameBye = 2
	// frameMeta carries the sender's metadata straight to a peer (Tell): a
	// change of State there at once instead of after some gossip rounds.
	frameMeta = 3
	// frameReach asks nothing of its receiver (Reach): its delivery, or
	// the dial's refusal, is the answer.
	frameReach = 4

	maxFrameString = 255
	frameSigSize   = ed25519.SignatureSize
)

// signatureLabel starts the bytes a frame's signature covers, so that a
// signature made for a frame means nothing anywhere else.
const signatureLabel = "gorovod membership frame v2\x00"

type frame struct {
	kind    uint8
	jobID   string
	from    string
	seq     uint64
	payload []byte
	sig     []byte // frameSigSize bytes
}

// appendFrame appends f's encoding, f.sig included (which must have
// frameSigSize bytes; signFrame makes it).
func appendFrame(b []byte, f *frame) []byte {
	b = appendUnsigned(b, f)
	return append(b, f.sig...)
}

// appendUnsigned appends f's encoding up to its signature.
func appendUnsigned(b []byte, f *frame) []byte {
	b = append(b, frameMagic0, frameMagic1, frameVersion, f.kind)
	b = appendString(b, f.jobID)
	b = appendString(b, f.from)
	b = binary.LittleEndian.AppendUint64(b, f.seq)
	return append(b, f.payload...)
}

func frameSize(f *frame) int { return 14 + len(f.jobID) + len(f.from) + len(f.payload) + frameSigSize }

// signedBytes is what a frame's signature covers: the label, the receiver's
// name and the frame up to its signature (unsigned).
func signedBytes(to string, unsigned []byte) []byte {
	b := make([]byte, 0, len(signatureLabel)+1+len(to)+len(unsigned))
	b = append(b, signatureLabel...)
	b = appendString(b, to)
	return append(b, unsigned...)
}

// signFrame encodes f for receiver to, signed with key.
func signFrame(key ed25519.PrivateKey, to string, f *frame) []byte {
	unsigned := appendUnsigned(make([]byte, 0, frameSize(f)), f)
	return append(unsigned, ed25519.Sign(key, signedBytes(to, unsigned))...)
}

// verifyFrame reports whether frame b (as decoded into f) was signed with
// key for receiver to.
func verifyFrame(key ed25519.PublicKey, to string, b []byte) bool {
	if len(key) != ed25519.PublicKeySize || len(b) < frameSigSize {
		return false
	}
	unsigned, sig := b[:len(b)-frameSigSize], b[len(b)-frameSigSize:]
	return ed25519.Verify(key, signedBytes(to, unsigned), sig)
}

// decodeFrame parses b; payload and sig alias b. It refuses unknown
// versions and kinds, an empty sender or job, sequence number 0, a frame
// without room for its signature, and a goodbye with a payload. It does not
// check the signature (verifyFrame, with the sender's key).
func decodeFrame(b []byte, f *frame) error {
	if len(b) < 4 || b[0] != frameMagic0 || b[1] != frameMagic1 {
		return errors.New("membership: message without the frame magic")
	}
	if b[2] != frameVersion {
		return fmt.Errorf("membership: message frame version %d, want %d", b[2], frameVersion)
	}
	kind := b[3]
	if kind < frameData || kind > frameReach {
		return fmt.Errorf("membership: unknown message kind %d", kind)
	}
	r := reader{b: b[4:]}
	job, from := r.str(), r.str()
	if r.err != nil {
		return r.err
	}
	if job == "" || from == "" {
		return errors.New("membership: message without a job or a sender")
	}
	if len(r.b) < 8+frameSigSize {
		return errors.New("membership: message without a sequence number and a signature")
	}
	seq := binary.LittleEndian.Uint64(r.b)
	if seq == 0 {
		return errors.New("membership: message with sequence number 0")
	}
	payload, sig := r.b[8:len(r.b)-frameSigSize], r.b[len(r.b)-frameSigSize:]
	if (kind == frameBye || kind == frameReach) && len(payload) != 0 {
		return errors.New("membership: goodbye or reach message with a payload")
	}
	*f = frame{kind: kind, jobID: job, from: from, seq: seq, payload: payload, sig: sig}
	return nil
}
