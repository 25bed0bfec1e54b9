package transport

import (
	"errors"
	"fmt"
)

// Security is how a network transport protects the frames of a link once
// its handshake has authenticated both ends. Every rank of a job must use
// the same setting: the handshake refuses a peer with another one.
type Security uint8

const (
	// SecurityDefault, the zero value, is the transport's default
	// (DefaultSecurity).
	SecurityDefault Security = iota
	// SecurityPlain sends frames as they are: only the handshake is
	// authenticated, so anyone on the path can read, forge or replay frames.
	SecurityPlain
	// SecurityAuthenticated adds a tag to every frame (AES-GCM over header
	// and payload as additional data, a key per direction of each link, a
	// sequence number in the nonce): a changed, forged, replayed, reordered
	// or dropped frame breaks the link instead of reaching the caller.
	// Frames still travel readable.
	SecurityAuthenticated
	// SecurityEncrypted is SecurityAuthenticated with the header and the
	// payload encrypted too (AES-GCM).
	SecurityEncrypted
)

// DefaultSecurity is what SecurityDefault stands for.
const DefaultSecurity = SecurityAuthenticated

// ErrFrameAuth is wrapped by the error of a link whose peer's frame failed
// authentication: changed on the way, forged, replayed, reordered or cut.
// The link is broken for good, as after any other corruption of its stream.
var ErrFrameAuth = errors.New("frame failed authentication (changed, forged, replayed, reordered or cut on the way)")

// Resolve returns the setting SecurityDefault stands for, or s itself.
func (s Security) Resolve() Security {
	if s == SecurityDefault {
		return DefaultSecurity
	}
	return s
}

// Valid reports whether s is one of the settings above.
func (s Security) Valid() bool { return s <= SecurityEncrypted }

func (s Security) String() string {
	switch s {
	case SecurityDefault:
		return "default"
	case SecurityPlain:
		return "plain"
	case SecurityAuthenticated:
		return "authenticated"
	case SecurityEncrypted:
		return "encrypted"
	}
	return fmt.Sprintf("security(%d)", uint8(s))
}

// ParseSecurity reads a setting by its name: plain, authenticated or
// encrypted ("" and "default" are SecurityDefault).
func ParseSecurity(name string) (Security, error) {
	switch name {
	case "", "default":
		return SecurityDefault, nil
	case "plain":
		return SecurityPlain, nil
	case "authenticated":
		return SecurityAuthenticated, nil
	case "encrypted":
		return SecurityEncrypted, nil
	}
	return 0, fmt.Errorf("unknown data plane security %q (plain, authenticated or encrypted)", name)
}
