package membership

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
)

// What binds a message to its sender. Every member holds the gossip key (it
// comes from the job secret), and memberlist's NotifyMsg does not say which
// connection a message came on, so a sender name inside a message proves
// nothing by itself. Each incarnation therefore makes an Ed25519 key pair at
// Join, publishes the public half in its Meta (SigningKey), and signs every
// frame it sends for its receiver. A receiver pins the first key it sees
// under a name and refuses any later alive message, merge or frame that
// names another key, verifies each frame with the pinned key, and accepts
// each of a sender's sequence numbers once.
//
// What that guarantees: a process that holds the job secret but not member
// X's private key cannot make a member that has learned X's key accept a
// message as X's — not by naming X, not by replaying a frame X sent (to that
// member or to another), not by publishing another key under X's name. What
// it does not: a member accepts the first key it hears under a new name, so
// a secret holder that publishes a name before its real owner joins owns it
// there (the real member is then refused, loudly, rather than impersonated);
// and memberlist's own failure detection (suspect, dead) is protected only
// by the shared gossip key, so a secret holder can still have members
// declared dead.
//
// Metadata is sealed the same way: what a member hands memberlist as its
// NodeMeta is its encoded Meta, a per-incarnation sequence number and an
// Ed25519 signature over both and the member's name (sealMeta). memberlist's
// alive messages are only as good as the gossip key, so without the seal a
// secret holder could gossip an alive message for member X with a higher
// incarnation and X's published key but its own CollectiveAddr, and every
// member would believe it until X refuted it: the next world's collectives
// would dial the forger. With it, metadata under X's name that X did not
// sign is refused at every alive message, merge and Announce; metadata X
// signed earlier than the newest one a member has accepted (a replay of an
// older CollectiveAddr or State) is not applied there. memberlist itself
// may keep a replayed copy for a while (its alive messages carry no seal
// of their incarnation, and a stale copy from a lagging peer is routine, so
// refusing those would only make noise), until X refutes it.
//
// The seal does not cover the gossip address in memberlist's alive message
// (memberlist picks it after the metadata is made), and memberlist lets a
// member that left come back at another address, taking a dead message
// that names its own sender as a leave: a secret holder could send "X
// left" in X's name, then "X is alive" elsewhere with X's own sealed
// metadata, and members would probe and message X where nothing answers,
// and report it failed. So the gossip address is pinned as the key is: the
// first one a member sees under a name is the only one it accepts for that
// name (an incarnation never moves; a restarted process has a new name).

// ErrMetaUnsealed is wrapped by the error that refuses metadata not signed
// by the key it publishes under its member's name (see sealMeta).
var ErrMetaUnsealed = errors.New("membership: metadata not sealed by its member")

// ErrGossipAddrChanged is wrapped by the error that refuses an alive
// message or merge naming a member at another gossip address than the
// first one seen under its name.
var ErrGossipAddrChanged = errors.New("membership: a member's gossip address changed")

// ErrSigningKeyChanged is wrapped by the error that refuses a member whose
// published signing key differs from the first one seen under its name.
var ErrSigningKeyChanged = errors.New("membership: a member's signing key changed")

// replayWindow is how far behind the newest sequence number from a sender a
// frame may arrive and still be accepted (once): Sends run on their own
// streams, so frames to one member overtake one another.
const replayWindow = 64

// maxGonePeers bounds the pinned keys and sequence windows kept for names
// that are not alive members (gone, or only heard of): beyond it the oldest
// are forgotten.
const maxGonePeers = 1024

// peerAuth is what this member knows of one peer's signatures, and how many
// frames it sent to it. Guarded by Member.mu.
type peerAuth struct {
	key ed25519.PublicKey // pinned; nil until the peer's metadata is seen
	// top is the highest sequence number accepted from the peer; bit i of
	// seen is set when top-i was accepted.
	top, seen uint64
	sent      uint64 // the last sequence number this member sent to the peer
	// metaSeq is the sequence number of the newest sealed metadata
	// applied from the peer (sealMeta); sealed is the sealed metadata last
	// accepted from it, verified.
	metaSeq uint64
	sealed  []byte
	// addr is the gossip address first seen under the peer's name, pinned.
	addr  netip.AddrPort
	alive bool // an alive member (else queued in Member.goneAuth)
}

// fresh records sequence number seq from the peer and reports whether it is
// new: above every number accepted before, or within replayWindow of the
// highest and not accepted yet.
func (a *peerAuth) fresh(seq uint64) bool {
	switch {
	case seq > a.top:
		if shift := seq - a.top; shift >= replayWindow {
			a.seen = 0
		} else {
			a.seen <<= shift
		}
		a.seen |= 1
		a.top = seq
		return true
	case a.top-seq >= replayWindow:
		return false
	default:
		bit := uint64(1) << (a.top - seq)
		if a.seen&bit != 0 {
			return false
		}
		a.seen |= bit
		return true
	}
}

// authLocked returns name's entry, making one (not alive, queued to be
// forgotten) if there is none. Member.mu must be held.
func (m *Member) authLocked(name string) *peerAuth {
	a := m.auth[name]
	if a == nil {
		a = &peerAuth{}
		m.auth[name] = a
		m.queueGoneLocked(name)
	}
	return a
}

// queueGoneLocked queues name to be forgotten once more than maxGonePeers
// names that are not alive members are remembered. Member.mu must be held.
func (m *Member) queueGoneLocked(name string) {
	m.goneAuth = append(m.goneAuth, name)
	for len(m.goneAuth) > maxGonePeers {
		old := m.goneAuth[0]
		m.goneAuth = m.goneAuth[1:]
		if a := m.auth[old]; a != nil && !a.alive && !m.goneQueuedLater(old) {
			delete(m.auth, old)
		}
	}
}

// goneQueuedLater reports whether name is queued again (it went, came back
// and went again): its entry is forgotten at its last place in the queue.
func (m *Member) goneQueuedLater(name string) bool {
	for _, n := range m.goneAuth {
		if n == name {
			return true
		}
	}
	return false
}

// pin checks a member's published signing key against the first one seen
// under its name, and remembers it if it is the first.
func (m *Member) pin(name string, meta *Meta) error {
	if len(meta.SigningKey) != ed25519.PublicKeySize {
		return fmt.Errorf("membership: node %s publishes no signing key", name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.authLocked(name)
	switch {
	case a.key == nil:
		a.key = bytes.Clone(meta.SigningKey)
	case !bytes.Equal(a.key, meta.SigningKey):
		m.keysRefused.Add(1)
		return fmt.Errorf("%w: node %s", ErrSigningKeyChanged, name)
	}
	return nil
}

// pinAddr checks the gossip address an alive message or merge gives a
// member against the first one seen under its name, and remembers it if it
// is the first.
func (m *Member) pinAddr(name string, addr netip.AddrPort) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.authLocked(name)
	switch {
	case !a.addr.IsValid():
		a.addr = addr
	case a.addr != addr:
		m.addrsRefused.Add(1)
		return fmt.Errorf("%w: node %s at %v, first seen at %v", ErrGossipAddrChanged, name, addr, a.addr)
	}
	return nil
}

// staleMetaLocked reports whether metadata name sealed under seq is older
// than the newest accepted from it, and otherwise records seq as the newest.
// A stale copy is counted, not applied. Member.mu must be held.
func (m *Member) staleMetaLocked(name string, seq uint64) bool {
	a := m.authLocked(name)
	if seq < a.metaSeq {
		m.metaRefused.Add(1)
		return true
	}
	a.metaSeq = seq
	return false
}

// Sealed metadata, what a member hands memberlist as its NodeMeta and sends
// in a frameMeta:
//
//	meta  the Meta's encoding (MarshalBinary)
//	seq   uint64, little-endian: the member's count of its metadata, from 1
//	sig   64 bytes: Ed25519, by the key in meta (Meta.SigningKey), over
//	      metaSealLabel, the member's name (uint8 length + name), meta and seq
const metaSealSize = 8 + ed25519.SignatureSize

// metaSealLabel starts the bytes a metadata seal covers, so that it means
// nothing as any other signature (a frame's has its own label).
const metaSealLabel = "gorovod membership meta v1\x00"

func metaSigned(name string, unsealed []byte) []byte {
	b := make([]byte, 0, len(metaSealLabel)+1+len(name)+len(unsealed))
	b = append(b, metaSealLabel...)
	b = appendString(b, name)
	return append(b, unsealed...)
}

// sealMeta seals the encoded metadata enc of member name as its seq-th.
func sealMeta(key ed25519.PrivateKey, name string, enc []byte, seq uint64) []byte {
	b := binary.LittleEndian.AppendUint64(append(make([]byte, 0, len(enc)+metaSealSize), enc...), seq)
	return append(b, ed25519.Sign(key, metaSigned(name, b))...)
}

// openMeta decodes sealed metadata b of member name. It checks the seal
// against the key the metadata publishes (pin then checks that key against
// name's) unless b is exactly the sealed metadata last accepted from name
// (memberlist hands every copy of a member's alive message to NotifyAlive,
// and then to NotifyJoin or NotifyUpdate: each would cost a verification).
func (m *Member) openMeta(name string, b []byte) (Meta, uint64, error) {
	var meta Meta
	if len(b) < metaSealSize {
		return meta, 0, fmt.Errorf("%w: node %s: %d bytes, no seal", ErrMetaUnsealed, name, len(b))
	}
	unsealed, sig := b[:len(b)-ed25519.SignatureSize], b[len(b)-ed25519.SignatureSize:]
	if err := meta.UnmarshalBinary(unsealed[:len(unsealed)-8]); err != nil {
		return meta, 0, err
	}
	if len(meta.SigningKey) != ed25519.PublicKeySize {
		return meta, 0, fmt.Errorf("membership: node %s publishes no signing key", name)
	}
	seq := binary.LittleEndian.Uint64(unsealed[len(unsealed)-8:])
	m.mu.Lock()
	a := m.auth[name]
	known := a != nil && bytes.Equal(a.sealed, b)
	m.mu.Unlock()
	if !known && !ed25519.Verify(meta.SigningKey, metaSigned(name, unsealed), sig) {
		return meta, 0, fmt.Errorf("%w: node %s: the seal does not verify", ErrMetaUnsealed, name)
	}
	return meta, seq, nil
}

// acceptedMeta remembers b as the sealed metadata last accepted from name
// (see openMeta).
func (m *Member) acceptedMeta(name string, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := m.auth[name]; a != nil && !bytes.Equal(a.sealed, b) {
		a.sealed = bytes.Clone(b)
	}
}

// setAliveLocked marks name's entry as an alive member's, or as gone (then
// queued to be forgotten). Member.mu must be held.
func (m *Member) setAliveLocked(name string, alive bool) {
	a := m.authLocked(name)
	if a.alive && !alive {
		m.queueGoneLocked(name)
	}
	a.alive = alive
}

// authenticate checks frame b (decoded into f) from f.from: signed for this
// member with the sender's pinned key, and a sequence number not accepted
// before. It returns a counter to bump when the frame is refused.
func (m *Member) authenticate(f *frame, b []byte) (ok bool, refused *atomic.Uint64) {
	m.mu.Lock()
	a := m.auth[f.from]
	var key ed25519.PublicKey
	if a != nil {
		key = a.key
	}
	m.mu.Unlock()
	// Verify without the lock: it takes tens of microseconds.
	if key == nil || !verifyFrame(key, m.name, b) {
		return false, &m.messagesUnverified
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if a = m.auth[f.from]; a == nil || !bytes.Equal(a.key, key) || !a.fresh(f.seq) {
		return false, &m.messagesReplayed
	}
	return true, nil
}

// nextSeq returns the sequence number of this member's next frame to name.
func (m *Member) nextSeq(name string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.authLocked(name)
	a.sent++
	return a.sent
}
