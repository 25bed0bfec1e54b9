package shm

import (
	"encoding/binary"
	"fmt"
)

// The setup exchange runs over each bootstrap link right after the
// authenticated handshake, as frames whose header has Coll = setupColl and
// Step = the message type. Messages have fixed sizes and strict decoders (as
// the handshake's do): unused bytes must be zero, so a message that decodes
// re-encodes to the same bytes. Every message starts with:
//
//	0 magic   uint32 'G','V','S','M'
//	4 version uint8
//	5 type    uint8  hello, offer, reply or done
//	6 flags   uint8  hello: flagShared; reply, done: flagOK
//	7 zero
//
// hello (both ranks): 8 host [32]byte, 40 uid uint32, 44 pid uint32, 48 pid
// namespace uint64, 56 probe address uint64, 64 probe [16]byte: where in the
// sender's memory the peer may try to read the probe bytes (see single-copy in
// link_linux.go).
// offer (lower rank): 8 ringBytes uint64, 16 name [maxStemLen]byte, the files'
// common name, zero-padded.
// reply (higher rank, after opening everything) and done (lower rank, after
// opening its write ends): flags flagOK and flagSingleCopy (the sender read the
// peer's probe, so the peer may send it large payloads by reference);
// 8 reason [maxReason]byte, zero-padded ASCII, empty when flagOK is set.
const (
	setupColl    uint8  = 0xF5 // no collective uses this kind
	setupMagic   uint32 = 'G' | 'V'<<8 | 'S'<<16 | 'M'<<24
	setupVersion uint8  = 1

	msgHello uint8 = 1
	msgOffer uint8 = 2
	msgReply uint8 = 3
	msgDone  uint8 = 4

	flagShared     uint8 = 1 // hello: this rank can and wants to share memory
	flagOK         uint8 = 1 // reply, done: the sender's part succeeded
	flagSingleCopy uint8 = 2 // reply, done: the sender can read the peer's memory

	maxReason = 96
	// maxStemLen bounds the files' common name (see stem).
	maxStemLen = 160

	probeSize = 16
	helloSize = 8 + 32 + 4 + 4 + 8 + 8 + probeSize
	offerSize = 8 + 8 + maxStemLen
	replySize = 8 + maxReason
)

// setupMsgSize is the size of each message type.
func setupMsgSize(typ uint8) int {
	switch typ {
	case msgHello:
		return helloSize
	case msgOffer:
		return offerSize
	case msgReply, msgDone:
		return replySize
	}
	return 0
}

type hello struct {
	shared    bool
	host      [32]byte
	uid       uint32
	pid       uint32
	pidNS     uint64
	probeAddr uint64
	probe     [probeSize]byte
}

type offer struct {
	ringBytes uint64
	name      string
}

// reply is also the done message.
type reply struct {
	ok         bool
	singleCopy bool
	reason     string
}

func putSetupPrefix(b []byte, typ, flags uint8) {
	binary.LittleEndian.PutUint32(b, setupMagic)
	b[4], b[5], b[6], b[7] = setupVersion, typ, flags, 0
}

func checkSetupPrefix(b []byte, typ uint8) (flags uint8, err error) {
	if len(b) != setupMsgSize(typ) {
		return 0, fmt.Errorf("setup message of %d bytes, want %d", len(b), setupMsgSize(typ))
	}
	if m := binary.LittleEndian.Uint32(b); m != setupMagic {
		return 0, fmt.Errorf("setup message with bad magic %#08x", m)
	}
	if b[4] != setupVersion {
		return 0, fmt.Errorf("setup message version %d, this side speaks %d", b[4], setupVersion)
	}
	if b[5] != typ {
		return 0, fmt.Errorf("setup message type %d, want %d", b[5], typ)
	}
	if b[7] != 0 || b[6]&^(flagOK|flagSingleCopy) != 0 {
		return 0, fmt.Errorf("setup message reserved bits set")
	}
	return b[6], nil
}

func (m *hello) encode(b []byte) {
	var f uint8
	if m.shared {
		f = flagShared
	}
	putSetupPrefix(b, msgHello, f)
	copy(b[8:40], m.host[:])
	binary.LittleEndian.PutUint32(b[40:], m.uid)
	binary.LittleEndian.PutUint32(b[44:], m.pid)
	binary.LittleEndian.PutUint64(b[48:], m.pidNS)
	binary.LittleEndian.PutUint64(b[56:], m.probeAddr)
	copy(b[64:], m.probe[:])
}

func decodeHello(b []byte, m *hello) error {
	f, err := checkSetupPrefix(b, msgHello)
	if err != nil {
		return err
	}
	if f&^flagShared != 0 {
		return fmt.Errorf("hello with flags %#x", f)
	}
	*m = hello{shared: f&flagShared != 0, uid: binary.LittleEndian.Uint32(b[40:]), pid: binary.LittleEndian.Uint32(b[44:]),
		pidNS: binary.LittleEndian.Uint64(b[48:]), probeAddr: binary.LittleEndian.Uint64(b[56:])}
	copy(m.host[:], b[8:40])
	copy(m.probe[:], b[64:])
	return nil
}

func (m *offer) encode(b []byte) {
	putSetupPrefix(b, msgOffer, 0)
	binary.LittleEndian.PutUint64(b[8:], m.ringBytes)
	n := copy(b[16:], m.name)
	clear(b[16+n : offerSize])
}

func decodeOffer(b []byte, m *offer) error {
	f, err := checkSetupPrefix(b, msgOffer)
	if err != nil {
		return err
	}
	if f != 0 {
		return fmt.Errorf("offer with flags %#x", f)
	}
	name := b[16:]
	n := 0
	for n < len(name) && name[n] != 0 {
		c := name[n]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("offer names a file with byte %#02x", c)
		}
		n++
	}
	if n == 0 || !allZero(name[n:]) {
		return fmt.Errorf("offer name is empty or not zero-padded")
	}
	*m = offer{ringBytes: binary.LittleEndian.Uint64(b[8:]), name: string(name[:n])}
	return nil
}

func (m *reply) encode(b []byte, typ uint8) {
	var f uint8
	if m.ok {
		f = flagOK
		if m.singleCopy {
			f |= flagSingleCopy
		}
	}
	putSetupPrefix(b, typ, f)
	field := b[8:replySize]
	n := 0
	if !m.ok {
		for i := 0; i < len(m.reason) && n < maxReason; i++ {
			c := m.reason[i]
			if c < 0x20 || c > 0x7e {
				c = '?'
			}
			field[n] = c
			n++
		}
	}
	clear(field[n:])
}

func decodeReply(b []byte, typ uint8, m *reply) error {
	f, err := checkSetupPrefix(b, typ)
	if err != nil {
		return err
	}
	field := b[8:replySize]
	n := 0
	for n < len(field) && field[n] != 0 {
		if c := field[n]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("setup reason holds byte %#02x", c)
		}
		n++
	}
	if !allZero(field[n:]) {
		return fmt.Errorf("setup reason is not zero-padded")
	}
	ok := f&flagOK != 0
	if ok && n != 0 {
		return fmt.Errorf("successful setup message carries a reason")
	}
	if !ok && f&flagSingleCopy != 0 {
		return fmt.Errorf("failed setup message offers single copy")
	}
	*m = reply{ok: ok, singleCopy: f&flagSingleCopy != 0, reason: string(field[:n])}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
