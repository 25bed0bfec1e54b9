package framesec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
)

// TagSize is the size of the tag behind every sealed unit.
const TagSize = 16

// SegmentSize is the largest payload piece one tag covers: a receiver
// verifies a segment right after reading it, while it is still in cache,
// and a sender needs at most one segment of scratch to encrypt into. It
// matches the collectives' default pipelining chunk, so a ring step's
// frame is usually one segment.
const SegmentSize = 256 << 10

// KeySize is the size of each direction's AES key.
const KeySize = 16

// Keys is what a link needs to protect its frames: the setting and, unless
// it is SecurityPlain, a key for each direction.
type Keys struct {
	Security transport.Security // resolved: never SecurityDefault
	Send     [KeySize]byte
	Recv     [KeySize]byte
	// Chain is the link's secret for moving it into a later world
	// (Rekey): both ends hold the same one, whatever the setting.
	Chain [ChainSize]byte
}

// ChainSize is the size of a link's chaining secret.
const ChainSize = 32

const (
	infoLabel      = "gorovod data plane v1 "
	dialerToAccept = "dialer->acceptor"
	acceptToDialer = "acceptor->dialer"
	chainLabel     = "link chain"
	rekeyLabel     = "gorovod rekey v1 "
	lowToHigh      = "low->high"
	highToLow      = "high->low"
)

// RekeyMAC is the MAC of an encoded rekey message (transport.MACInput of
// it) under the link's chaining secret.
func RekeyMAC(chain *[ChainSize]byte, msg []byte) [transport.RekeyMACSize]byte {
	h := hmac.New(sha256.New, chain[:])
	h.Write(msg)
	var out [transport.RekeyMACSize]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Rekey derives a link's keys for the world its two ends move into, from
// its current chaining secret and both ends' rekey messages (mine, sent by
// this end, and theirs, each as checked by transport.CheckRekey): the
// salt is both nonces, the derivation names the job, the new epoch, world
// size, both new ranks, the lane and the setting. Directions are named by
// the new ranks, so each end's Send is the other's Recv. The result has a
// new chaining secret for the next move.
func Rekey(sec transport.Security, chain *[ChainSize]byte, job uint64, mine, theirs *transport.RekeyMsg) (Keys, error) {
	k := Keys{Security: sec}
	lo, hi := mine, theirs
	if mine.From > theirs.From {
		lo, hi = theirs, mine
	}
	salt := make([]byte, 0, 2*transport.RekeyNonceSize)
	salt = append(append(salt, lo.Nonce[:]...), hi.Nonce[:]...)
	prk, err := hkdf.Extract(sha256.New, chain[:], salt)
	if err != nil {
		return k, err
	}
	var b [8 + 8 + 4*4 + 1]byte
	binary.LittleEndian.PutUint64(b[0:], job)
	binary.LittleEndian.PutUint64(b[8:], mine.Epoch)
	binary.LittleEndian.PutUint32(b[16:], mine.Size)
	binary.LittleEndian.PutUint32(b[20:], lo.From)
	binary.LittleEndian.PutUint32(b[24:], hi.From)
	binary.LittleEndian.PutUint32(b[28:], mine.Lane)
	b[32] = uint8(sec)
	info := rekeyLabel + string(b[:])
	next, err := hkdf.Expand(sha256.New, prk, info+chainLabel, ChainSize)
	if err != nil {
		return k, err
	}
	copy(k.Chain[:], next)
	if sec == transport.SecurityPlain {
		return k, nil
	}
	up, err := hkdf.Expand(sha256.New, prk, info+lowToHigh, KeySize)
	if err != nil {
		return k, err
	}
	down, err := hkdf.Expand(sha256.New, prk, info+highToLow, KeySize)
	if err != nil {
		return k, err
	}
	if lo == mine {
		copy(k.Send[:], up)
		copy(k.Recv[:], down)
	} else {
		copy(k.Send[:], down)
		copy(k.Recv[:], up)
	}
	return k, nil
}

// Derive returns the keys of one end of a link whose handshake exchanged
// hello (the Hello as sent) and the acceptor's and dialer's nonces; dialer
// says which end this is.
func Derive(sec transport.Security, secret, hello, nonceA, nonceD []byte, dialer bool) (Keys, error) {
	k := Keys{Security: sec}
	salt := make([]byte, 0, len(nonceA)+len(nonceD))
	salt = append(append(salt, nonceA...), nonceD...)
	prk, err := hkdf.Extract(sha256.New, secret, salt)
	if err != nil {
		return k, err
	}
	info := infoLabel + string(hello)
	chain, err := hkdf.Expand(sha256.New, prk, info+chainLabel, ChainSize)
	if err != nil {
		return k, err
	}
	copy(k.Chain[:], chain)
	if sec == transport.SecurityPlain {
		return k, nil
	}
	d2a, err := hkdf.Expand(sha256.New, prk, info+dialerToAccept, KeySize)
	if err != nil {
		return k, err
	}
	a2d, err := hkdf.Expand(sha256.New, prk, info+acceptToDialer, KeySize)
	if err != nil {
		return k, err
	}
	if dialer {
		copy(k.Send[:], d2a)
		copy(k.Recv[:], a2d)
	} else {
		copy(k.Send[:], a2d)
		copy(k.Recv[:], d2a)
	}
	return k, nil
}

// WireSize is how many bytes a frame with a payload of n bytes takes on the
// wire under sec.
func WireSize(sec transport.Security, n int) int {
	if sec == transport.SecurityPlain {
		return transport.HeaderSize + n
	}
	return transport.HeaderSize + TagSize + n + Segments(n)*TagSize
}

// Segments is the number of segments of a payload of n bytes.
func Segments(n int) int { return (n + SegmentSize - 1) / SegmentSize }

// Sealer seals or opens the units of one direction of a link, in order. It
// is not safe for concurrent use: a link's send lock (or receive lock)
// guards it.
type Sealer struct {
	aead    cipher.AEAD
	encrypt bool
	seq     uint64 // units sealed or opened so far: the next nonce
	nonce   [12]byte
}

// NewSealer returns the sealer of one direction with key, for a link whose
// setting is sec (SecurityAuthenticated or SecurityEncrypted).
func NewSealer(sec transport.Security, key [KeySize]byte) (*Sealer, error) {
	if sec != transport.SecurityAuthenticated && sec != transport.SecurityEncrypted {
		return nil, fmt.Errorf("framesec: no sealer for security %v", sec)
	}
	block, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead, encrypt: sec == transport.SecurityEncrypted}, nil
}

// Encrypts reports whether units travel encrypted.
func (s *Sealer) Encrypts() bool { return s.encrypt }

// next returns the nonce of the next unit and counts it.
func (s *Sealer) next() []byte {
	binary.LittleEndian.PutUint64(s.nonce[:], s.seq)
	s.seq++
	return s.nonce[:]
}

// SealInPlace seals the unit b[:len(b)-TagSize] where it lies: encrypts it
// when the setting says so and writes its tag into the last TagSize bytes.
func (s *Sealer) SealInPlace(b []byte) {
	n := len(b) - TagSize
	if s.encrypt {
		s.aead.Seal(b[:0], s.next(), b[:n], nil)
		return
	}
	s.aead.Seal(b[n:n], s.next(), nil, b[:n])
}

// SealTo seals unit into dst, which must hold len(unit)+TagSize bytes and
// must not overlap unit unless it starts where unit does: ciphertext (or,
// authenticating only, a copy of unit) and tag. It returns the sealed bytes.
func (s *Sealer) SealTo(dst, unit []byte) []byte {
	dst = dst[:len(unit)+TagSize]
	if s.encrypt {
		return s.aead.Seal(dst[:0], s.next(), unit, nil)
	}
	copy(dst, unit)
	s.aead.Seal(dst[len(unit):len(unit)], s.next(), nil, unit)
	return dst
}

// Tag writes the tag of unit, which travels as it is, into tag (TagSize
// bytes). Only for SecurityAuthenticated.
func (s *Sealer) Tag(tag, unit []byte) {
	s.aead.Seal(tag[:0], s.next(), nil, unit)
}

// OpenInPlace checks the sealed unit b (the unit, then its tag) and, when
// it is encrypted, decrypts it where it lies. It returns the unit, or
// transport.ErrFrameAuth, in which case the unit's bytes are not to be used
// (and may have been overwritten).
func (s *Sealer) OpenInPlace(b []byte) ([]byte, error) {
	n := len(b) - TagSize
	if n < 0 {
		return nil, transport.ErrFrameAuth
	}
	if s.encrypt {
		out, err := s.aead.Open(b[:0], s.next(), b, nil)
		if err != nil {
			return nil, transport.ErrFrameAuth
		}
		return out, nil
	}
	if _, err := s.aead.Open(nil, s.next(), b[n:], b[:n]); err != nil {
		return nil, transport.ErrFrameAuth
	}
	return b[:n], nil
}

// OpenTo checks the sealed unit (the unit, then its tag) and writes the
// unit into dst (len(sealed)-TagSize bytes; it may not overlap sealed
// unless it starts where sealed does). On transport.ErrFrameAuth dst's
// contents are undefined.
func (s *Sealer) OpenTo(dst, sealed []byte) error {
	n := len(sealed) - TagSize
	if n < 0 || len(dst) != n {
		return transport.ErrFrameAuth
	}
	if s.encrypt {
		if _, err := s.aead.Open(dst[:0], s.next(), sealed, nil); err != nil {
			return transport.ErrFrameAuth
		}
		return nil
	}
	if _, err := s.aead.Open(nil, s.next(), sealed[n:], sealed[:n]); err != nil {
		return transport.ErrFrameAuth
	}
	copy(dst, sealed[:n])
	return nil
}

// Verify checks the tag of unit, which traveled as it is. Only for
// SecurityAuthenticated.
func (s *Sealer) Verify(unit, tag []byte) error {
	if _, err := s.aead.Open(nil, s.next(), tag, unit); err != nil {
		return transport.ErrFrameAuth
	}
	return nil
}

// Sub returns keys for a second, independent stream of the same link (label
// names it): each direction's key is expanded from that direction's link key,
// so the two streams never share a key and nonce, and both ends derive the
// same pair from the keys the handshake gave them.
func (k Keys) Sub(label string) (Keys, error) {
	sub := Keys{Security: k.Security}
	if k.Security == transport.SecurityPlain {
		return sub, nil
	}
	send, err := hkdf.Key(sha256.New, k.Send[:], nil, infoLabel+"sub "+label, KeySize)
	if err != nil {
		return sub, err
	}
	recv, err := hkdf.Key(sha256.New, k.Recv[:], nil, infoLabel+"sub "+label, KeySize)
	if err != nil {
		return sub, err
	}
	copy(sub.Send[:], send)
	copy(sub.Recv[:], recv)
	return sub, nil
}
