// Package transport owns how gorovod's collectives reach other workers: the
// Transport and Link interfaces every transport implements (tcp, shm, sctp,
// inproc, and multi, which picks shared memory or the network per pair), the
// frame header all of them carry, the typed errors that name the peer behind
// a failure, and the defaults their configurations share (DefaultIOTimeout,
// DefaultHandshakeTimeout, ErrInvalidConfig) and the data-plane settings
// (Security).
//
// A frame is a fixed HeaderSize header followed by Length payload bytes. The
// header names the job, the membership epoch and the sender, so a frame from
// another job, an old epoch or a stranger is rejected before any payload is read;
// and the collective it belongs to (sequence number, kind, dtype, op, element
// count, step), so ranks that call mismatched collectives see an error instead of
// reducing garbage.
//
// The connection handshake every transport runs (fixed-size Hello,
// Challenge, Response and Verdict messages, HMAC-SHA256 proofs of the job
// secret) is internal/handshake, and the logic around it internal/mesh;
// the state and checks every transport's links share (the peer named in
// errors, closed and broken directions, wait deadlines) are
// internal/linkutil; the per-link keys the handshake yields and the sealing
// of frames with them (Security: plain, authenticated or encrypted) are
// internal/framesec. Outside the transports a failed handshake is a
// *HandshakeError, and a frame that fails authentication breaks its link
// with an error wrapping ErrFrameAuth. The conformance package is the suite
// every transport passes.
//
// A link whose two ends are both members of the next world can be carried
// into it instead of being dialled again (Carry, RekeyableLink,
// PartialConnector): two rekey frames each way move it to the new epoch and
// ranks, with new keys on a sealed link (rekey.go).
package transport
