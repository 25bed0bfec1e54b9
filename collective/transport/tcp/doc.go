// Package tcp is gorovod's TCP transport: one long-lived listener per worker that
// connects world after world (one per membership epoch) into full meshes of
// authenticated, deadline-bounded frame streams.
//
// # Connecting a world
//
// In every pair of ranks the higher rank dials and the lower rank accepts, so each
// pair ends up with exactly one connection and nobody needs to break ties. The
// dialer retries while its peer is not listening yet or has not started
// connecting that world, until the caller's context ends; a peer that has
// authenticated but whose world has not started on this side is parked for a
// short while so that a Connect starting a moment later can claim it.
//
// Both sides prove knowledge of the job secret with an HMAC-SHA256
// challenge-response (see handshake.Hello); a wrong job, a wrong secret or an
// epoch older than one this transport already connects is refused for good, so
// a stale worker cannot slip into a new world.
//
// Each accepted connection is handshaken on its own goroutine, with bounded
// reads and a bounded number of concurrent handshakes (256 in all,
// Config.HandshakesPerSource from one host). A newcomer has
// Config.PreAuthTimeout to send its hello and its proof, so a stranger that
// sends garbage, or nothing at all, costs one short-lived goroutine and
// holds its slot briefly; a flood from one host cannot take the slots the
// job's own ranks need.
//
// # Protected frames
//
// The handshake also gives each link its keys (package framesec), and
// Config.Security says what they protect: nothing (plain), every frame's
// integrity, order and origin (authenticated), or that and its contents
// (encrypted). By default links to other hosts are authenticated and links
// between ranks of this host plain, as the host is the trust boundary of
// shared memory too. A sealed frame is its header and each 256 KiB
// payload segment followed by an AES-GCM tag; the receiver verifies the
// header before RecvHeader returns it and each segment before reading the
// next, so RecvPayload succeeds only once every byte it wrote is
// authenticated. A frame that fails breaks the link like any other
// corruption, with an error naming the peer and wrapping
// transport.ErrFrameAuth. Authenticated frames go from and into the
// caller's buffers directly (writev and readv with the tags between the
// segments); encrypted ones through one segment-sized buffer per direction,
// allocated on a link's first large frame.
//
// # Links
//
// Every blocking Link call is bounded by the earlier of the context's deadline
// and Config.IOTimeout of silence; cancelling the context wakes it at once. A
// small frame goes out in one write (copied behind the header), a large one
// with writev of header and payload, and large payloads are read straight
// into the caller's buffer; each system call moves all that is left (see
// link.go for why not in pieces). At frame boundaries the receiving goroutine
// yields, so at GOMAXPROCS=1 a rank's sending goroutine gets its turn. Errors name the
// peer's rank and address. A RecvHeader cut short by its context or the I/O
// timeout may be retried, since no byte of the stream was consumed; after any
// other error the link is broken for good, and the caller closes it and gives
// up on the world.
//
// # Lanes
//
// A link may run over several connections to its peer (Config.Lanes; by
// default one between ranks of this host, four between hosts). Each is
// dialed and handshaken on its own, with keys of its own; the hellos of
// the further lanes carry handshake.LaneNonce, which ties them to the
// link's first connection, and the acceptor builds the link only once all
// its lanes are in. Frames and their order live on the first lane; a data
// frame of 64 KiB or more is cut into contiguous stripes, one per lane,
// each moved by that lane's own goroutine straight from and into the
// callers' buffers (lanes.go). A lane's failure breaks the whole link.
// How many lanes carry a direction's data frames is its sender's choice,
// announced to the receiver with a FrameLanes frame on the first lane:
// all of them when Config.Lanes sets the count; by default the sender
// measures the rate the path delivers (bytes acknowledged) while it sends
// its first large frames over one lane, then two, then four, and keeps the
// count past which the rate stopped rising by a tenth (autolanes.go).
//
// # Waiting
//
// The socket is read and written with non-blocking system calls through
// syscall.RawConn. A call that finds nothing to read (or no room to write)
// polls for up to Config.SpinTime — yielding to the process's goroutines every
// other attempt (and to other processes too when the world has more ranks on
// this host than the host has CPUs), and checking its context and Close —
// before it parks in Go's network poller. Parking and being woken costs tens
// of microseconds, more when the waking CPU was idle (a virtual CPU in
// particular), where a rank waiting for its peer's next chunk usually waits a
// few. The polling bound adapts per direction (package spin): it halves while
// waits outlast it, so a job blocked on a silent peer, or whose waits are long,
// spends almost no CPU polling.
//
// # Socket buffers
//
// Once a world is connected, its links between ranks of this host get 4 MiB
// send and receive buffers when the host's ranks do not outnumber its CPUs
// and the kernel grants that much (Config.SocketBuffer): the kernel's
// autotuning grows a receive buffer too slowly for a ring step's burst of
// chunks, and on loopback a window that is too small makes the receiver's
// core transmit the sender's data, out of order. Ranks sharing CPUs, and
// links to other hosts, keep autotuning.
package tcp
