// Package inproc is a transport whose links are queues inside one process:
// several ranks in one process (tests of code that runs on communicators, a
// world of goroutines) with no sockets. It is a transport.Transport like the
// others and passes the same conformance suite: a Network plays the network,
// each Transport listening on it gets an address there, and Connect runs the
// same handshake as TCP and SCTP (package mesh: job, epoch and rank checks,
// HMAC proofs of the job secret) over in-memory connections before it hands
// out links. Mesh builds the links of a whole world at once, without
// handshakes, for tests that only need links.
//
// Frames are copied on send, so senders may reuse their buffers at once, as
// with a network transport; the copies go into buffers the receiver is done
// with, and each link reuses its timers, so a steady stream of frames
// allocates nothing. A link queues up to Config.BufferBytes of payload
// before Send waits (a larger frame is queued alone), and IOTimeout bounds a
// wait on a silent peer.
package inproc
