// Package linkutil is the link scaffolding the transports share, kept once so
// that a fix to it reaches every transport: what a link knows of its peer and
// how it names the peer in its errors (transport.PeerError), whether it was
// closed and which direction broke, the checks that open every Send,
// RecvHeader and RecvPayload, whether a link is intact enough to be carried
// into the next world (Intact), the deadline of a blocking wait (the earlier of
// IOTimeout of silence and the context's deadline) and what an expired wait
// means, the error for a link that broke in an unexpected way, and the small
// helpers each transport's Config uses to fill in defaults.
//
// It owns no data path: each transport moves bytes its own way (a socket, an
// SCTP stream, a shared-memory ring, a queue). Links embed Base by value and
// call its methods directly, so the per-frame path gains neither an interface
// call nor an allocation; errors are allocated only when a call fails.
package linkutil
