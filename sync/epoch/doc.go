// Package epoch owns the elastic layer's membership protocol: its vocabulary
// — a World is one numbered, ordered member list (a world epoch) that every
// member agrees on before it runs collectives in it, and a Source is how a
// session learns them — and the protocol itself, as two pure state
// machines in the style of etcd's raft.
//
// # The state machines
//
// Proposer is the side that makes epochs (the job's driver, or a worker that
// took over); Follower is a worker's side (it adopts epochs, answers probes,
// routes its reports, and runs a Proposer when it is elected). Neither does
// I/O, starts goroutines or reads a clock: the caller feeds them inputs with
// Step(now, input) and the passing of time with Tick(now), at Deadline (the
// zero time when nothing is pending, so an idle job costs nothing), and
// carries out the outputs both return. Given the same inputs at the same
// times they return the same outputs. Package sync/driver runs them over
// gossip; this package's tests run them over a simulated network.
//
// Inputs (Input):
//   - membership: PeerSeen (joined, or new metadata: joining, ready, leaving),
//     PeerGone (left, or declared dead: Failed);
//   - a known death: Exited (the launcher saw the process end, or its
//     gossip port refused a connection);
//   - messages: Received (an epoch, a failure report, a ping, a pong, the end
//     of training) and SendFailed (a send that could not be delivered);
//   - the driver's decisions: Evict (out for good), SetMinWorkers,
//     SetFirstWorld;
//   - a worker's session (Follower): ReportFailure, ReportDone.
//
// Outputs (Output): Send (a Message to a member), Proposed (a new epoch),
// Adopted (a worker's newer epoch), Finished (training is over); and, for logs
// and observers, the decisions: Waiting, NoQuorum, Removed (with a Reason), Suspected,
// Cleared, Rescued, TookOver, SteppedDown, Unroutable, Ignored, Refused.
//
// # The protocol
//
//   - Who proposes: the driver while one is alive; otherwise the oldest ready
//     worker (Elect), once no driver has been in its view for the takeover
//     grace. A proposer taking over (Resume) first asks every worker in view
//     which epoch it knows (the pong answering a ping carries it) and
//     continues the numbering after the newest: the previous proposer's last
//     epoch may have reached only some workers.
//   - What it proposes: survivors keep their order and joiners are appended;
//     changes within Coalesce make one epoch; none below MinWorkers (the job
//     waits); an evicted worker is never admitted again.
//   - The quorum (CheckQuorum): a world is proposed only if it holds a
//     strict majority of every world that may still be training (the last
//     one all its members acknowledged, and each proposed after it),
//     counting only members not known to be gone (left, evicted,
//     finished, exited: Exited); the driver wins a tie. A proposer without it proposes
//     nothing (NoQuorum) and the members wait: two sides of a partition, or
//     of a false death declared by gossip, never both form a world that
//     trains. The job's first world has no earlier world to take a majority
//     of: its voters are the job's first workers, FirstWorld (`gorovod run
//     --np`, less those known gone; CheckFirstQuorum), so that workers cut
//     off from the driver as it forms, which no world has reached, form no
//     first world of their own beside the driver's. With FirstWorld not
//     known (0), a first world needs no quorum.
//   - Delivery: each epoch goes to every worker in view, and each worker
//     acknowledges every epoch it receives (a pong without a nonce, carrying
//     the newest it knows); the epoch is sent again to those that have not,
//     after Resend (or twice the time half the workers took to acknowledge
//     the last epoch, when that is longer), then twice as long, up to every
//     Reannounce. A worker adopts only a higher number.
//   - Failures: a worker blamed for a failed collective is probed (three
//     pings within ProbeTimeout) and removed only if it does not answer; at
//     a world's first failure report every other member is probed too (the
//     census), so that a dead member nobody blamed yet is found before the
//     world is formed again; not when the launcher lost a member of that
//     world (Evict with Lost: it takes out every worker of a lost host at
//     once), and a blamed worker already out for good is not probed. A
//     member of the current world that gossip declared dead (PeerGone,
//     Failed) is probed the same way and stays
//     until the probe ends: an answer (or gossip's own refutation) keeps it,
//     in view again; no answer within ProbeTimeout, or a ping that cannot
//     be sent, removes it. A graceful leave and a known exit (Exited) are
//     not probed. The world that failed is formed again (a newer
//     epoch, same members if no one was removed) once the probes are
//     answered or their members removed, as its members wait for one. A
//     worker re-sends its report until a newer epoch arrives. A suspect that proves alive
//     before an epoch without it is put back; one still ready later was
//     waiting to join and is admitted again.
//   - The end: a member's done message ends admissions; members whose last
//     step failed get a world without the finished ones, however small (the
//     rescue); a worker that proposes stays until they are done
//     (StillTraining), as its successor would not know training is over.
//
// What is guaranteed (and checked by the randomized test over a network that
// loses, duplicates, delays and reorders messages, with crashes, freezes,
// evictions and the driver's death): no two live workers ever hold different
// worlds under one number, across takeovers too; numbers have no gaps; a
// worker adopts only higher numbers and enters only worlds that include it,
// one at a time; every live member of an epoch receives it or a later one;
// once quiet, one proposer remains and every ready worker trains in its
// world; every worker that trained finishes. A number is proposed again, for
// another world, only when its first world died with its proposer and every
// worker that received it. Assumed: a dead proposer's messages arrive within
// the takeover grace or never, and a probe's round trip is well under
// ProbeTimeout.
//
// # What a message cannot do
//
// Messages come from the network; the membership layer binds each to its
// signing sender (see package membership), and the machines bound what a
// sender may ask for. An epoch number above MaxNumber, or more than MaxLead
// above the newest number the machine knows, is refused (Refused, wrapping
// ErrNumberOutOfRange): nothing derived from a number can wrap to 0. A
// failure report counts only from a member of the current world, about it,
// once per member and world (ErrNotMember, ErrRepeated); its blame only of a
// member of that world; and a worker that answers its probes is removed as
// stuck only on the blame of two members (one, in a world of two). The end
// of training counts only from a member of the current world, about a world
// of its unbroken membership (ErrNotMember). A Follower adopts an epoch only
// from a driver in view, the member it elects, or a member of its newest
// world (ErrNotProposer).
//
// # A member that comes back
//
// Members are keyed by name, and a name is one incarnation (the membership
// layer gives each process start a new one). A worker left out of a world it
// was a member of cannot come back under its name: its session ends
// (ErrExcluded). To come back it joins again as a new incarnation — a new
// gossip member with a new name, in state joining then ready — and the
// proposer admits it like any joiner at the next epoch, while the old name
// stays removed (and, if the driver evicted it, excluded for good). Nothing
// in the machines needs to change for that; only a gossip member that
// refutes its death under its old name, still ready, is admitted again under
// it (as before), which serves a worker whose session never saw the epoch
// without it.
package epoch
