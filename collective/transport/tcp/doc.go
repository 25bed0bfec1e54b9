// Package tcp is gorovod's TCP transport: one long-lived listener per worker that
// connects world after world (one per membership epoch) into full meshes of
// authenticated, deadline-bounded frame streams.
//
// # Connecting a world
//
// In every pair of ranks the higher rank dials and the lower rank accepts, so each
// pair ends up with exactly one connection and nobody needs to break ties. The
// dialer retries while its peer is not listening yet or has not started
// connecting that world, until the caller's context ends; a peer that has
// authenticated but whose world has not started on this side is parked for a
// short while so that a Connect starting a moment later can claim it.
//
// Both sides prove knowledge of the job secret with an HMAC-SHA256
// challenge-response (see handshake.Hello); a wrong job, a wrong secret or an
// epoch older than one this transport already connects is refused for good, so
// a stale worker cannot slip into a new world.
//
// Each accepted connection is handshaken on its own goroutine under
// Config.HandshakeTimeout, with bounded reads and a bounded number of concurrent
// handshakes, so a stranger that sends garbage, or nothing at all, costs one
// short-lived goroutine and never delays a real peer.
//
// # Links
//
// Every blocking Link call is bounded by the earlier of the context's deadline
// and Config.IOTimeout of silence; cancelling the context wakes it at once. A
// frame goes out in one write (small frames are copied behind the header,
// large ones are sent with writev) and large payloads are read straight into the
// caller's buffer. Errors name the peer's rank and address. A RecvHeader cut
// short by its context or the I/O timeout may be retried, since no byte of the
// stream was consumed; after any other error the link is broken for good, and
// the caller closes it and gives up on the world.
package tcp
