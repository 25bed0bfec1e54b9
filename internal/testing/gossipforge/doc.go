// Package gossipforge speaks memberlist's wire protocol from outside a
// cluster, for tests that attack gorovod's gossip as another process on the
// network would: it builds memberlist's suspect, dead and alive messages
// (UDP packets) and push/pull state exchanges (TCP streams), encrypted with a
// given key (the job's gossip key, as an insider holding the job secret
// derives it), with a wrong one, or not at all (an outsider), and sends them
// to a member's gossip port over real sockets.
//
// The encoding follows memberlist v0.7's: a packet is an optional AES-GCM
// envelope (version byte 1, a 12-byte nonce, ciphertext and tag; no
// additional data when no label is configured, which gorovod does not) around
// one message-type byte and a MessagePack body whose map keys are the Go
// field names; a stream message is the encryptMsg byte, a big-endian uint32
// length and the same envelope, authenticated with those five bytes. Only
// what the attacks need is here. It is test support, not a client: nothing
// outside tests imports it.
package gossipforge
