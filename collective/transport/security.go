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
	// SecurityDefault, the zero value, lets the transport choose per link:
	// a network transport seals the frames of a link to another host
	// (BetweenHosts) and leaves plain those of a link between two processes
	// of one host, which, like shared memory, stays inside the host: only
	// its root could change bytes on the way, and root can change the
	// processes themselves.
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

// BetweenHosts is what SecurityDefault stands for on a link between two
// hosts.
const BetweenHosts = SecurityAuthenticated

// ErrFrameAuth is wrapped by the error of a link whose peer's frame failed
// authentication: changed on the way, forged, replayed, reordered or cut.
// The link is broken for good, as after any other corruption of its stream.
var ErrFrameAuth = errors.New("frame failed authentication (changed, forged, replayed, reordered or cut on the way)")

// ForLink returns the setting of a link under s: s itself, or, for
// SecurityDefault, BetweenHosts unless the link's two ends are on one host
// (sameHost), SecurityPlain then.
func (s Security) ForLink(sameHost bool) Security {
	switch {
	case s != SecurityDefault:
		return s
	case sameHost:
		return SecurityPlain
	}
	return BetweenHosts
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
