// Package handshake is the connection handshake every gorovod transport runs
// (through package mesh) before a connection becomes a link: the fixed-size
// messages Hello, Challenge, Response and Verdict with their strict decoders,
// the acceptor's answers (Status), and the HMAC-SHA256 proofs by which both
// ends show they hold the job secret. Only the transports use it; what a
// failed handshake looks like to everyone else is transport.HandshakeError.
package handshake
