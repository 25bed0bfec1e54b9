// Package rendezvous lets locally launched workers learn each other's transport
// addresses before their first communicator exists: the launcher runs a Server,
// each worker Joins with its rank and address and receives the full list once
// every rank has checked in. Messages are single JSON lines over TCP. It carries
// addresses only; the transport handshake authenticates the peers themselves.
package rendezvous
