// Package shm is gorovod's shared-memory transport for ranks on one host: each
// pair of ranks shares one memory-mapped region holding two single-producer /
// single-consumer byte rings, one per direction, so a frame moves with one copy
// into the ring on the sending side and one copy out of it on the receiving side.
// Large frames (Config.SingleCopyBytes, 2 MiB by default: a collective's
// pipelined chunks are faster through the ring) move with a single copy: the ring
// carries only the payload's address, the receiver copies the payload straight
// out of the sender's memory (process_vm_readv) and Send waits for that. This
// is used where a probe at connect time shows it is permitted, and while the
// host's ranks of the world do not outnumber its CPUs (a Send waiting for a
// receiver that is not running costs more than the copy saved).
//
// # Connecting
//
// A world is first connected over a bootstrap transport (TCP by default), which
// runs gorovod's authenticated handshake (job, epoch, ranks, HMAC proof of the
// job secret). Over each bootstrap link the two ranks then exchange a setup
// message naming their host (HostID: the kernel's boot id and the identity of
// the shared-memory file system), user and process. When both are on one host,
// the lower rank creates the region and four FIFOs (below) under Config.Dir
// (/dev/shm), owner-only (0600), named after the job, the epoch, the pair and
// the creating process; the higher rank checks and opens them; then every file
// is unlinked at once, so nothing stays in Config.Dir while the world runs,
// whoever dies later. Files left by a process killed in the middle of a setup are
// removed by the next transport created on the host (New and every Connect
// sweep Config.Dir for files whose creating process is gone). The bootstrap
// link is closed once the shared-memory link stands.
//
// With Config.Fallback, a pair on two hosts keeps its bootstrap link instead of
// failing, which is how a mixed world (some pairs over shared memory, some over
// TCP) is connected; package multi builds on that.
//
// # Waiting
//
// A receiver that finds its ring empty (and a sender that finds it full, or
// waiting for its single copy to be taken) spins for Config.SpinTime, since the
// peer usually answers within microseconds from the other core; every 64 polls
// it yields to the other goroutines of its process (runtime.Gosched: at
// GOMAXPROCS=1 the sending goroutine runs only then) and to other processes
// (sched_yield: when ranks outnumber cores, the peer may need this very core).
// Ranks that outnumber the cores spin up to ten times longer
// (spin.NewYieldingBudget): the rank a wait is for often shares the core and
// runs as soon as this one yields, where a parked wait would add a wake-up.
// RecvHeader also yields once per frame, so a receiver that always finds data
// cannot starve the process's sender. Then it parks in the Go netpoller on a
// FIFO of its own, after raising a waiting flag in the region; the peer, seeing
// the flag after it publishes, writes one byte to that FIFO. A FIFO read is used rather than a
// futex because a futex wait is a blocking system call: it keeps the calling
// thread's P until the runtime's monitor retakes it (tens of microseconds, more
// when idle), which at GOMAXPROCS=1 — how `gorovod bench` starts its workers —
// stalls the communicator's other goroutine. A parked FIFO read frees the P at
// once and costs nothing while idle.
//
// # Failures
//
// The FIFOs are also how death shows: each side holds the write ends of its
// peer's FIFOs, the kernel closes them when a process dies however it dies, and
// the peer's parked read returns end-of-file. A clean Close also raises a closed
// flag in the region. A waiting call therefore wakes on the peer's death or
// close (first delivering any complete frames still in the ring, as a socket
// would), on its context's end, on Link.Close, and after Config.IOTimeout of
// silence, with the same errors as the TCP transport. Values read from the region
// (ring counters, frame headers) are checked before use, so a corrupt or hostile
// peer can break the link but never make this side read out of bounds.
package shm
