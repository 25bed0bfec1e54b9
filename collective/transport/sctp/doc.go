// Package sctp is gorovod's SCTP transport: SCTP associations (the pure-Go
// github.com/pion/sctp) over UDP, one association per pair of ranks, with the
// same handshake, connection rules, link semantics and frame protection as
// the TCP transport (Config.Security: each message of a frame carries an
// AES-GCM tag under the link's keys, or is encrypted; by default between
// hosts). It exists for networks where SCTP's message framing and
// multi-streaming are wanted, or TCP is not; on one host the shared-memory
// transport, and on most networks TCP, are faster (see docs/transports.md).
//
// # Connecting
//
// Each transport has one UDP socket on its advertised address. It only takes
// connect requests: a dialer sends a small datagram there, and the acceptor
// answers from a fresh UDP socket of its own, connected to the dialer, which
// connects its socket to that one in turn. Each association thus has a pair of
// connected sockets and the kernel, not this package, sorts packets by peer.
// The dialer then starts the SCTP association and, on stream 0, runs the same
// handshake as the TCP transport (handshake.Hello, Challenge, Response,
// Verdict, HMAC-SHA256 proofs of the job secret): the higher rank of each pair
// dials, wrong secrets, jobs and stale epochs are refused for good, a peer that
// is not connecting the world yet is parked for a while or told to retry, and
// strangers cost one bounded, short-lived handshake.
//
// # Links
//
// A link uses stream 0 of its association, ordered and reliable. The
// communicator runs one collective at a time per link, so one stream suffices;
// SCTP's other streams would only help collectives that interleave on a link.
// A frame is sent as SCTP messages of at most messageBytes: the first holds the
// HeaderSize header and the start of the payload, the others the rest, so the
// receiver knows every message's size in advance and reads large payloads
// straight into the caller's buffer. Messages stay far below the receive
// buffer, since pion stalls on a message larger than it.
//
// pion queues writes without limit, so Send waits while more than
// Config.SendBuffer bytes are queued and not yet acknowledged
// (Stream.BufferedAmount, woken by OnBufferedAmountLow); IOTimeout bounds how
// long that queue may stay stuck. Reads are bounded by the context's deadline
// and IOTimeout of silence, as with TCP; while a read waits, the link sends an
// SCTP HEARTBEAT every Config.ProbeInterval, so a peer whose process died (its
// port answers with ICMP "port unreachable", which fails the connected socket)
// is noticed within about that interval rather than at IOTimeout. Close hands
// what is still queued a short time to be acknowledged, then aborts the
// association; the peer reads what it already received, then ErrPeerClosed.
//
// Settings are tuned for throughput on loopback and LANs: MTU 8192 (the
// largest pion receives) and a 16 MiB receive window.
package sctp
