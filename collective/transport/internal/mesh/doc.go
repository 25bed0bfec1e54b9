// Package mesh is the half of the TCP, SCTP and in-process transports that does not
// depend on how bytes move: turning one listening endpoint into world after
// world of authenticated links.
//
// It owns, for one endpoint:
//
//   - both sides of the connection handshake (handshake.Hello, Challenge,
//     Response, Verdict), with the refusals that decide from a Hello alone
//     (wrong job, stale epoch, wrong rank or world) and the HMAC proofs;
//   - the cap on handshakes in progress, in all and per source host, so
//     strangers cost bounded memory and one host cannot crowd out the job;
//   - the refusal of a dialer whose data-plane setting (Hello.Security)
//     differs, and each new link's keys (framesec.Derive);
//   - routing each authenticated arrival to the Connect waiting for its world,
//     or parking it for half a handshake timeout in case that Connect is about
//     to start, and remembering recent authentication failures for it;
//   - Connect itself: dialing the lower ranks with backoff, waiting for the
//     higher ones, replacing a rank's stale duplicate, and the typed errors that
//     name a rank that could not be reached or authenticated.
//
// A transport supplies what differs: how a raw connection is accepted (it
// calls Admit, Accept and Route from its own goroutines, so the accept loop,
// and what a connection costs before its handshake, stay its own business),
// how one is dialed (Config.Dial), and, through the Conn it hands over, how a
// handshake message is read and written within its deadlines and how an
// authenticated connection becomes a transport.Link.
package mesh
