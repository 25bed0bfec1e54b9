package epoch

import "slices"

// Quorum is the verdict of CheckQuorum on a proposed world.
type Quorum struct {
	// Voters are the members of the base world whose departure is not
	// known (they may be alive on the other side of a partition);
	// Present are those of them in the proposed world.
	Voters, Present int
	// Missing lists the voters the proposed world lacks, in the base
	// world's rank order: the members gossip only suspects.
	Missing []string
	// Driver: the proposer is the job's driver, which wins a tie.
	Driver bool
	// First: the proposed world is the job's first (no world exists yet,
	// CheckFirstQuorum). Voters is then the job's size less its first
	// workers known to be gone, not a count of names, and Missing is empty.
	First bool
}

// OK reports whether the proposed world holds the quorum: a strict majority
// of the voters, or exactly half of them when the job's driver proposes it
// (the driver's half vote breaks the tie). No voters (a base world whose
// every member is known to be gone, or a first world of a job whose size is
// not known) need none.
func (q Quorum) OK() bool {
	if q.Voters == 0 {
		return true
	}
	bonus := 0
	if q.Driver {
		bonus = 1
	}
	return 2*q.Present+bonus > q.Voters
}

// CheckQuorum decides whether next may follow base, a world that may still
// be training (a Proposer checks each: the last one all its members
// acknowledged, and every one proposed after it). The rule keeps two proposers on the two sides of
// a partition, or of a false death declared by gossip under load, from
// forming two worlds that both train:
//
//   - Members known to be gone do not vote: departed reports them (a
//     graceful leave, an eviction, the end of training, a process whose exit
//     its launcher saw, a gossip port that refused a connection). After real
//     deaths the survivors go on however few they are.
//   - The other members of base vote, and a world is valid only with a
//     strict majority of them. Two valid worlds proposed from one base then
//     share a member, which adopts only one of them (a worker adopts only a
//     higher number, one world at a time), so at most one of them trains.
//   - The job's driver proposing a world of exactly half the voters wins the
//     tie (Quorum.OK): a worker that proposes never has the driver in view,
//     so the two halves cannot both claim it.
//
// A world that fails the rule is not proposed: its members wait at their
// step boundary (bounded by their recovery timeout) until the missing
// members come back, are known to be gone, or the network heals and the
// other side's world reaches them.
func CheckQuorum(base World, next []Member, departed func(name string) bool, driver bool) Quorum {
	q := Quorum{Driver: driver}
	for _, m := range base.Members {
		if departed != nil && departed(m.Name) {
			continue
		}
		q.Voters++
		if slices.ContainsFunc(next, func(n Member) bool { return n.Name == m.Name }) {
			q.Present++
		} else {
			q.Missing = append(q.Missing, m.Name)
		}
	}
	return q
}

// CheckFirstQuorum decides whether next may be the job's first world, which
// has no earlier world to hold a majority of. Its voters are the job's
// first workers: size, the number it was started with (`gorovod run --np`,
// ProposerConfig.FirstWorld), less those known to be gone (their processes
// exited before any world formed). The rule is CheckQuorum's with those
// voters: a strict majority of them, or exactly half when the driver
// proposes (Quorum.OK). Without it, workers cut off from the driver as the
// first world forms, which no world has reached, would take over proposing
// and form a first world of their own beside the driver's, and both would
// train. Every member of next counts as present: a worker started by hand
// before the first world formed counts as one of the first (see
// docs/multihost.md). A size of 0 (not known) needs no quorum.
func CheckFirstQuorum(size int, next []Member, driver bool) Quorum {
	return Quorum{Voters: max(size, 0), Present: len(next), Driver: driver, First: true}
}
