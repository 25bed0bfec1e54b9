// Package framesec is the data-plane protection of gorovod's network
// transports (tcp, sctp): the per-link keys derived from a completed
// handshake, and the sealing and opening of each piece of a frame on the
// wire.
//
// # Keys
//
// Once the handshake has proved that both ends hold the job secret, each end
// derives two 128-bit AES keys, one per direction, with HKDF-SHA256: the
// secret is the job secret, the salt both handshake nonces, and the info the
// Hello exactly as it was sent (job, epoch, both ranks, world size, security
// setting, the dialer's nonce) followed by the direction. Every link of every
// world thus gets keys of its own, unknown to anyone without the secret, and
// no two links, directions or epochs share a key.
//
// The same derivation also yields the link's chaining secret, which both
// ends hold whatever the setting. A link carried into the next world
// (transport.RekeyableLink) MACs its rekey message with it (RekeyMAC) and
// takes its new keys and next chaining secret from it with HKDF-SHA256,
// salted with both ends' fresh nonces, the info naming the job, the new
// epoch, world size, both new ranks, the lane and the setting (Rekey); the
// counters start again at zero.
//
// # Wire layout
//
// With SecurityAuthenticated or SecurityEncrypted a frame is sealed in units:
// the 64-byte header, then the payload cut into SegmentSize pieces (the last
// one shorter). Each unit is followed by a TagSize tag:
//
//	header (64) | tag (16) | segment 0 | tag | segment 1 | tag | ...
//
// That is the layout of a stream transport (TCP). A message transport
// (SCTP) seals each message of a frame as one unit instead: the first holds
// the header and the start of the payload, each later one more payload.
//
// A tag is AES-GCM's under the direction's key, with the unit as additional
// data (authenticated: GMAC) or as plaintext (encrypted: the unit travels
// encrypted). The 96-bit nonce is the number of units sealed before in that
// direction, so the receiver, which counts the same way, detects a unit that
// was changed, replayed, reordered, dropped or cut off: its tag does not
// verify. Segment boundaries follow from the header's length, which its tag
// covers. A receiver verifies each unit before handing any of it on, so an
// allreduce never reduces bytes that have not been authenticated.
package framesec
