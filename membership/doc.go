// Package membership owns who is in a gorovod job right now: every worker (and
// the optional driver) process is a Member of a gossip cluster built on
// github.com/hashicorp/memberlist, and this package turns that cluster into the
// facts the elastic layer needs.
//
// It owns:
//
//   - Meta, the metadata each member publishes (job id, role, collective
//     transport address, host identity, joining/ready/leaving state, GPU count,
//     start time, a few free-form pairs) and its compact, strictly validated
//     binary encoding, which, sealed by its member (auth.go), always fits
//     memberlist's 512-byte NodeMeta limit (memberlist panics beyond it, so
//     an oversized Meta is an error here, never a panic).
//   - Config and DefaultConfig: gossip timings tuned for training clusters on a
//     LAN (a crash is seen in about a second instead of memberlist's 4-5 s; a
//     frequent push/pull keeps joins from stalling for tens of seconds), and the
//     AES-GCM gossip key derived from the job secret.
//   - Join / Leave / Shutdown: the life of one incarnation of a member. A member
//     name is unique per incarnation, because memberlist refuses a restarted
//     process that reuses its old name at a new address ("Conflicting
//     address").
//   - Members, Local and Events: the alive members with decoded Meta, sorted by
//     start time (oldest first, the order the epoch proposer rule uses), and a
//     typed stream of Joined / Updated / Left / Failed events that never blocks
//     memberlist and never loses a member's latest state.
//   - Send and Messages: small messages between members of the same job, each
//     over its own encrypted TCP stream (so not lost in transit, but not
//     ordered, and lost if the receiver dies or does not keep up), on which
//     the epoch agreement protocol rides. Each is signed by its sender's
//     per-incarnation Ed25519 key (Meta.SigningKey) for its receiver and
//     numbered: Message.From is the member whose key signed it, and a
//     replayed or redirected message is dropped (auth.go says exactly what
//     this guarantees and what it does not).
//
// It does not decide world membership: epochs, ranks and the proposer protocol
// live above it and only read Members, Events and Messages.
//
// What gossip says about a member is the member's own: its metadata is
// sealed with its signing key (a secret holder cannot publish another
// CollectiveAddr for it, nor replay an older one), and the gossip address it
// was first seen at is pinned (it cannot be moved elsewhere). memberlist's
// suspect and dead messages carry no such seal: a secret holder can have a
// live member declared dead, which the member refutes (see auth.go).
//
// Nodes of another job are kept out twice: the gossip key comes from the job
// secret, so a stranger cannot decrypt anything; and a node that does hold the
// secret but publishes another JobID (a stale worker of an earlier run, a
// misconfigured secret shared between jobs) is refused at join and at every
// alive message, and its messages are dropped and counted (Stats).
//
// memberlist does not tell its event delegate whether a dead node left or
// crashed (Node.State is not filled in callbacks). A member that leaves through
// Leave therefore first publishes State=leaving and tells every peer directly;
// a peer that has heard either reports Left, otherwise Failed.
package membership
