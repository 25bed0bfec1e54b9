// Package conformance is the test suite every gorovod transport passes
// unchanged: a transport's tests call Run with a Factory that makes listening
// transports, and the suite checks, over real connections, what the
// transport.Transport and transport.Link contracts promise and the TCP
// transport (the reference) does:
//
//   - worlds of 1 to 4 ranks connect into full meshes; every ordered pair
//     exchanges frames concurrently in both directions;
//   - frames arrive in order and intact: every header field the caller owns,
//     the fields the transport owns set by the transport, zero-byte payloads,
//     payloads larger than 16 MiB, frames from concurrent senders never
//     interleaved;
//   - a few transport.InlinePayload frames can be sent before the peer reads;
//   - a peer that closes or dies is reported as ErrPeerClosed (after the
//     frames it sent before), Close wakes blocked calls with ErrLinkClosed,
//     a context's cancellation or deadline wakes blocked calls promptly with the
//     context's error, and IOTimeout bounds silence (not the length of a
//     transfer), after which RecvHeader may be retried;
//   - misuse (length mismatches, unknown kinds) fails the call without
//     breaking the link;
//   - a wrong secret, a wrong job or a stale epoch fails Connect with a fatal
//     *transport.HandshakeError, a missing rank with a *transport.PeerError
//     naming it; epochs follow each other over one transport; links outlive
//     their transport; Close ends a pending Connect;
//   - the collectives (package collective) give exact results over the links;
//   - no goroutine of the transport outlives a test, and, when the Factory
//     says so, the steady-state path does not allocate.
//
// Process-level failures (kill -9 of a peer process) and fuzzing of a
// transport's own wire formats depend on the transport and live in its own
// tests.
package conformance
