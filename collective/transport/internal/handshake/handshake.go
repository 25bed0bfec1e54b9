package handshake

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gorovod/gorovod/collective/transport"
)

// The connection handshake, shared by every stream transport.
//
// The dialer (the higher rank) opens with a Hello naming the world it wants and
// a fresh nonce. The acceptor answers with a Challenge: either a reject code,
// decided from the Hello alone (wrong job, stale epoch, wrong rank), or its own
// nonce and a MAC proving it knows the job secret. The dialer checks that MAC and
// answers with a Response carrying its own MAC; the acceptor checks it and ends
// with a Verdict. Both sides thus prove knowledge of the secret without sending
// it, and the distinct labels keep either side's MAC from being replayed as the
// other's.
//
// Every message has a fixed size, so a reader knows exactly how much to read and
// a hostile peer cannot make it allocate or wait for more. Every message starts
// with the same 8 bytes:
//
//	0 magic    uint32 'G','V','H','S'
//	4 version  uint8
//	5 type     uint8  hello, challenge, response or verdict
//	6 status   uint8  challenge and verdict: StatusOK or a reject code; 0 otherwise
//	7 rlen     uint8  challenge and verdict: reject reason length; 0 otherwise
//
// Decoders are strict: reserved bytes and unused fields must be zero, so a
// message that decodes re-encodes to exactly the same bytes.

// Magic opens every handshake message.
const Magic uint32 = 'G' | 'V'<<8 | 'H'<<16 | 'S'<<24

// Version is the handshake format version.
const Version uint8 = 1

// NonceSize is the size of each side's random nonce.
const NonceSize = 32

// MACSize is the size of an HMAC-SHA256 tag.
const MACSize = sha256.Size

// MaxRejectReason bounds the reason text of a reject.
const MaxRejectReason = 96

// Handshake message sizes.
const (
	handshakePrefix = 8
	// HelloSize: prefix, job uint64, epoch uint64, from, to, size uint32,
	// security uint8, extra lanes uint8, lane uint8, 1 reserved byte,
	// nonce.
	HelloSize = handshakePrefix + 8 + 8 + 4*4 + NonceSize
	// ChallengeSize: prefix, nonce, MAC, reason.
	ChallengeSize = handshakePrefix + NonceSize + MACSize + MaxRejectReason
	// ResponseSize: prefix, MAC.
	ResponseSize = handshakePrefix + MACSize
	// VerdictSize: prefix, reason.
	VerdictSize = handshakePrefix + MaxRejectReason
)

// Handshake message types (byte 5).
const (
	msgHello     uint8 = 1
	msgChallenge uint8 = 2
	msgResponse  uint8 = 3
	msgVerdict   uint8 = 4
)

// MAC labels keep the acceptor's and the dialer's tags from being interchangeable.
const (
	acceptorLabel = "gorovod-acceptor"
	dialerLabel   = "gorovod-dialer"
	laneLabel     = "gorovod-lane"
)

// Status is an acceptor's answer in a Challenge or Verdict.
type Status uint8

const (
	// StatusOK: go on (challenge) or connected (verdict).
	StatusOK Status = 0
	// RejectMalformed: the message made no sense.
	RejectMalformed Status = 1
	// RejectWrongJob: the acceptor serves another job.
	RejectWrongJob Status = 2
	// RejectStaleEpoch: the acceptor has moved on to a newer epoch of the job.
	RejectStaleEpoch Status = 3
	// RejectWrongRank: the acceptor is not the rank the dialer asked for, or the
	// dialer's rank does not fit the acceptor's world.
	RejectWrongRank Status = 4
	// RejectWrongWorld: same job and epoch, but a different world size.
	RejectWrongWorld Status = 5
	// RejectWrongSecret: the dialer's MAC did not verify.
	RejectWrongSecret Status = 6
	// RejectNotReady: the acceptor is not connecting that world (yet); retry.
	RejectNotReady Status = 7
	// RejectBusy: the acceptor has too many connections waiting; retry.
	RejectBusy Status = 8
	// RejectShutdown: the acceptor is shutting down.
	RejectShutdown Status = 9

	maxStatus = RejectShutdown
)

// Fatal reports whether retrying after this answer cannot help.
func (s Status) Fatal() bool {
	switch s {
	case StatusOK, RejectNotReady, RejectBusy:
		return false
	}
	return true
}

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case RejectMalformed:
		return "malformed handshake"
	case RejectWrongJob:
		return "wrong job"
	case RejectStaleEpoch:
		return "stale epoch"
	case RejectWrongRank:
		return "wrong rank"
	case RejectWrongWorld:
		return "world mismatch"
	case RejectWrongSecret:
		return "wrong secret"
	case RejectNotReady:
		return "world not ready"
	case RejectBusy:
		return "busy"
	case RejectShutdown:
		return "shutting down"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Hello is the dialer's opening message.
type Hello struct {
	JobHash uint64 // JobHash of the world's job id
	Epoch   uint64
	From    uint32 // the dialer's rank
	To      uint32 // the rank the dialer expects to reach
	Size    uint32 // the world size
	// Security is the dialer's data-plane setting (resolved, never
	// SecurityDefault): the acceptor refuses a dialer whose setting differs
	// from its own, and both derive the link's keys for it.
	Security transport.Security
	// Lanes is how many connections the link this connection belongs to
	// has (1 to MaxLanes; 0 means 1), and Lane this connection's place
	// among them. The acceptor refuses a dialer whose Lanes differs from
	// its own choice; a Hello of a lane past the first carries LaneNonce
	// as its Nonce, which ties it to the link's first connection.
	Lanes uint8
	Lane  uint8
	Nonce [NonceSize]byte
}

// MaxLanes bounds the connections one link may have.
const MaxLanes = 16

// Challenge is the acceptor's first answer. When Status is not StatusOK, Nonce
// and MAC are zero and Reason may explain; otherwise Reason is empty.
type Challenge struct {
	Status Status
	Reason string
	Nonce  [NonceSize]byte
	MAC    [MACSize]byte // AcceptorMAC
}

// Response is the dialer's proof.
type Response struct {
	MAC [MACSize]byte // DialerMAC
}

// Verdict is the acceptor's final answer.
type Verdict struct {
	Status Status
	Reason string
}

func putPrefix(b []byte, typ uint8, status Status, rlen int) {
	binary.LittleEndian.PutUint32(b[0:], Magic)
	b[4] = Version
	b[5] = typ
	b[6] = uint8(status)
	b[7] = uint8(rlen)
}

func malformed(format string, args ...any) error {
	return &transport.HandshakeError{Rank: -1, Fatal: true, Reason: "malformed handshake: " + fmt.Sprintf(format, args...)}
}

// checkPrefix validates the common prefix of a message of the given type and size
// and returns its status and reason length.
func checkPrefix(b []byte, typ uint8, size int, name string) (Status, int, error) {
	if len(b) != size {
		return 0, 0, malformed("%s of %d bytes, want %d", name, len(b), size)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != Magic {
		return 0, 0, malformed("bad magic %#08x (not a gorovod peer?)", m)
	}
	if v := b[4]; v != Version {
		return 0, 0, &transport.HandshakeError{Rank: -1, Fatal: true,
			Reason: fmt.Sprintf("handshake version %d, this side speaks %d", v, Version)}
	}
	if t := b[5]; t != typ {
		return 0, 0, malformed("message type %d, want %s (%d)", t, name, typ)
	}
	return Status(b[6]), int(b[7]), nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// putReason writes a reject reason into its fixed field as printable ASCII,
// truncated to MaxRejectReason, and returns its length. The reason travels to a
// peer that may print it, so it is kept free of control characters.
func putReason(field []byte, reason string) int {
	n := 0
	for i := 0; i < len(reason) && n < MaxRejectReason; i++ {
		c := reason[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		field[n] = c
		n++
	}
	clear(field[n:MaxRejectReason])
	return n
}

func getReason(field []byte, n int) (string, error) {
	if n > MaxRejectReason {
		return "", malformed("reason length %d over %d", n, MaxRejectReason)
	}
	for _, c := range field[:n] {
		if c < 0x20 || c > 0x7e {
			return "", malformed("reason holds byte %#02x", c)
		}
	}
	if !allZero(field[n:MaxRejectReason]) {
		return "", malformed("bytes after the reason are not zero")
	}
	return string(field[:n]), nil
}

func checkStatus(s Status) error {
	if s > maxStatus {
		return malformed("unknown status %d", uint8(s))
	}
	return nil
}

// Encode writes m into b, which must hold at least HelloSize bytes.
func (m *Hello) Encode(b []byte) {
	_ = b[HelloSize-1]
	putPrefix(b, msgHello, 0, 0)
	binary.LittleEndian.PutUint64(b[8:], m.JobHash)
	binary.LittleEndian.PutUint64(b[16:], m.Epoch)
	binary.LittleEndian.PutUint32(b[24:], m.From)
	binary.LittleEndian.PutUint32(b[28:], m.To)
	binary.LittleEndian.PutUint32(b[32:], m.Size)
	b[36] = uint8(m.Security)
	b[37] = max(m.Lanes, 1) - 1
	b[38] = m.Lane
	b[39] = 0
	copy(b[40:], m.Nonce[:])
}

// DecodeHello parses a Hello of exactly HelloSize bytes and checks that its
// ranks fit its world size.
func DecodeHello(b []byte, m *Hello) error {
	s, rlen, err := checkPrefix(b, msgHello, HelloSize, "hello")
	if err != nil {
		return err
	}
	if s != 0 || rlen != 0 || b[39] != 0 {
		return malformed("hello reserved bytes are not zero")
	}
	if sec := transport.Security(b[36]); sec == transport.SecurityDefault || !sec.Valid() {
		return malformed("hello names unknown data plane security %d", b[36])
	}
	var h Hello
	h.JobHash = binary.LittleEndian.Uint64(b[8:])
	h.Epoch = binary.LittleEndian.Uint64(b[16:])
	h.From = binary.LittleEndian.Uint32(b[24:])
	h.To = binary.LittleEndian.Uint32(b[28:])
	h.Size = binary.LittleEndian.Uint32(b[32:])
	h.Security = transport.Security(b[36])
	h.Lanes, h.Lane = b[37]+1, b[38]
	copy(h.Nonce[:], b[40:])
	switch {
	case int(b[37]) >= MaxLanes:
		return malformed("hello names %d lanes, at most %d", int(b[37])+1, MaxLanes)
	case h.Lane >= h.Lanes:
		return malformed("hello names lane %d of %d", h.Lane, h.Lanes)
	case h.Size < 2 || h.Size > transport.MaxWorldSize:
		return malformed("world size %d outside [2, %d]", h.Size, transport.MaxWorldSize)
	case h.From >= h.Size || h.To >= h.Size:
		return malformed("ranks %d -> %d outside world of size %d", h.From, h.To, h.Size)
	case h.From == h.To:
		return malformed("rank %d dials itself", h.From)
	}
	*m = h
	return nil
}

// Encode writes m into b, which must hold at least ChallengeSize bytes. A reject
// carries no nonce or MAC; the reason is sanitized and truncated.
func (m *Challenge) Encode(b []byte) {
	_ = b[ChallengeSize-1]
	if m.Status == StatusOK {
		putPrefix(b, msgChallenge, StatusOK, 0)
		copy(b[8:], m.Nonce[:])
		copy(b[8+NonceSize:], m.MAC[:])
		clear(b[8+NonceSize+MACSize : ChallengeSize])
		return
	}
	clear(b[8 : 8+NonceSize+MACSize])
	n := putReason(b[8+NonceSize+MACSize:], m.Reason)
	putPrefix(b, msgChallenge, m.Status, n)
}

// DecodeChallenge parses a Challenge of exactly ChallengeSize bytes.
func DecodeChallenge(b []byte, m *Challenge) error {
	s, rlen, err := checkPrefix(b, msgChallenge, ChallengeSize, "challenge")
	if err != nil {
		return err
	}
	if err := checkStatus(s); err != nil {
		return err
	}
	var c Challenge
	c.Status = s
	if s == StatusOK {
		if rlen != 0 || !allZero(b[8+NonceSize+MACSize:]) {
			return malformed("accepting challenge carries a reason")
		}
		copy(c.Nonce[:], b[8:])
		copy(c.MAC[:], b[8+NonceSize:])
	} else {
		if !allZero(b[8 : 8+NonceSize+MACSize]) {
			return malformed("rejecting challenge carries a nonce")
		}
		if c.Reason, err = getReason(b[8+NonceSize+MACSize:], rlen); err != nil {
			return err
		}
	}
	*m = c
	return nil
}

// Encode writes m into b, which must hold at least ResponseSize bytes.
func (m *Response) Encode(b []byte) {
	_ = b[ResponseSize-1]
	putPrefix(b, msgResponse, 0, 0)
	copy(b[8:], m.MAC[:])
}

// DecodeResponse parses a Response of exactly ResponseSize bytes.
func DecodeResponse(b []byte, m *Response) error {
	s, rlen, err := checkPrefix(b, msgResponse, ResponseSize, "response")
	if err != nil {
		return err
	}
	if s != 0 || rlen != 0 {
		return malformed("response reserved bytes are not zero")
	}
	copy(m.MAC[:], b[8:])
	return nil
}

// Encode writes m into b, which must hold at least VerdictSize bytes.
func (m *Verdict) Encode(b []byte) {
	_ = b[VerdictSize-1]
	n := 0
	if m.Status != StatusOK {
		n = putReason(b[8:], m.Reason)
	} else {
		clear(b[8:VerdictSize])
	}
	putPrefix(b, msgVerdict, m.Status, n)
}

// DecodeVerdict parses a Verdict of exactly VerdictSize bytes.
func DecodeVerdict(b []byte, m *Verdict) error {
	s, rlen, err := checkPrefix(b, msgVerdict, VerdictSize, "verdict")
	if err != nil {
		return err
	}
	if err := checkStatus(s); err != nil {
		return err
	}
	if s == StatusOK && rlen != 0 {
		return malformed("accepting verdict carries a reason")
	}
	reason, err := getReason(b[8:], rlen)
	if err != nil {
		return err
	}
	*m = Verdict{Status: s, Reason: reason}
	return nil
}

// AcceptorMAC is the acceptor's proof: HMAC-SHA256(secret, label || hello || nonceA),
// where hello is the Hello exactly as it was sent.
func AcceptorMAC(secret, hello []byte, nonceA *[NonceSize]byte) [MACSize]byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(acceptorLabel))
	mac.Write(hello)
	mac.Write(nonceA[:])
	var out [MACSize]byte
	mac.Sum(out[:0])
	return out
}

// DialerMAC is the dialer's proof: HMAC-SHA256(secret, label || hello || nonceA || nonceD).
func DialerMAC(secret, hello []byte, nonceA, nonceD *[NonceSize]byte) [MACSize]byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(dialerLabel))
	mac.Write(hello)
	mac.Write(nonceA[:])
	mac.Write(nonceD[:])
	var out [MACSize]byte
	mac.Sum(out[:0])
	return out
}

// LaneNonce is the Nonce of the Hello that opens lane `lane` (≥ 1) of a
// link: HMAC-SHA256(secret, label || hello0 || nonceA0 || lane), where
// hello0 is the Hello of the link's first connection as sent and nonceA0
// the acceptor's nonce of that connection. Only a holder of the secret
// who saw that handshake can compute it, and it differs for every link,
// so an acceptor can tell which link a lane belongs to and refuses a lane
// of a link it no longer has. The lane's keys still come from its own
// handshake, fresh through the acceptor's new nonce.
func LaneNonce(secret, hello0 []byte, nonceA0 *[NonceSize]byte, lane uint8) [NonceSize]byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(laneLabel))
	mac.Write(hello0)
	mac.Write(nonceA0[:])
	mac.Write([]byte{lane})
	var out [NonceSize]byte
	mac.Sum(out[:0])
	return out
}

// MACEqual compares two tags in constant time.
func MACEqual(a, b *[MACSize]byte) bool {
	return hmac.Equal(a[:], b[:])
}
