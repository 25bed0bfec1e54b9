// Package rendezvous lets locally launched workers learn each other's transport
// addresses before their first communicator exists: the launcher runs a Server,
// each worker Joins with its rank and address and receives the full list once
// every rank has checked in. Messages are single JSON lines over TCP.
//
// The port is reachable by any local process, so the server takes nothing on
// trust: a rank joins once (a second join is refused and changes nothing), a
// join line is bounded in length and in the time it may take to arrive, and
// at most Config.MaxPending connections that have not joined are served at
// once. With Config.Secret (the job secret, as launch.FixedWorld sets it) a
// join must be signed with an HMAC-SHA256 under the secret (JoinSecret), so a
// process without it cannot take a rank, and the reply is signed back. The
// transport handshake authenticates the peers themselves as well.
package rendezvous
