// Package multi chooses a transport per pair of ranks: shared memory
// (package shm) when both ranks are on one host, the network otherwise (TCP, or
// SCTP over UDP), so one world can mix both. It is also the one place a program
// turns a transport name from its configuration or command line ("auto", "tcp",
// "shm", "sctp") into a transport.Transport.
//
// In Auto mode every pair is first connected and authenticated over the
// network transport; the two ranks then compare host identities (see
// shm.HostID) over that link, and pairs on one host move to shared memory while
// the others keep the network link. The other modes force one transport for
// every pair: TCP or SCTP everywhere (for measurements, or hosts whose shared
// memory should not be used), or shared memory everywhere (Connect fails for a
// pair on two hosts).
package multi
