package membership

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
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
	alive     bool   // an alive member (else queued in Member.goneAuth)
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
