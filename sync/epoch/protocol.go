package epoch

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// PeerState is where a gossip member is in its life in the job, as the
// protocol needs it (the membership layer's joining, ready and leaving).
type PeerState uint8

// The states of a peer.
const (
	// Joining: in the gossip cluster, still starting up; not yet a candidate.
	Joining PeerState = iota + 1
	// Ready: may be placed in the next world.
	Ready
	// Leaving: leaving gracefully; keep it out of the next world.
	Leaving
)

func (s PeerState) String() string {
	switch s {
	case Joining:
		return "joining"
	case Ready:
		return "ready"
	case Leaving:
		return "leaving"
	}
	return fmt.Sprintf("PeerState(%d)", uint8(s))
}

// Peer is a member of the job's gossip cluster as the protocol sees it.
type Peer struct {
	Name string
	// Driver: the job's driver, which proposes while it is alive and takes
	// no part in worlds. Every other peer is a worker.
	Driver bool
	State  PeerState
	// Addr is a worker's collective transport address ("" until it has one).
	Addr string
	// StartedAt (Unix nanoseconds) orders the election: with no driver, the
	// oldest ready worker proposes.
	StartedAt int64
}

// Elect names the member that proposes epochs in a view of the cluster: the
// newest driver while one is alive (by StartedAt, then Name: a driver that
// took the job back supersedes the one it replaced, should that one come
// back), else the oldest ready worker (by StartedAt, then Name); "" when
// there is none. Every member computes the same answer from the same view.
func Elect(view []Peer) string {
	lead, found := Peer{}, false
	for _, p := range view {
		if (p.Driver || p.State == Ready) && (!found || before(p, lead)) {
			lead, found = p, true
		}
	}
	return lead.Name
}

// before orders election candidates: a driver first, the newest driver
// among drivers, else the oldest worker.
func before(a, b Peer) bool {
	if a.Driver != b.Driver {
		return a.Driver
	}
	if a.Driver {
		return cmp.Or(cmp.Compare(b.StartedAt, a.StartedAt), strings.Compare(a.Name, b.Name)) < 0
	}
	return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), strings.Compare(a.Name, b.Name)) < 0
}

// Supersedes says whether driver a takes precedence over driver b, another
// driver of the same job: a is the newer (Elect's order). Two drivers that
// see each other agree on which one stops: the order is total, whatever
// their clocks say.
func Supersedes(a, b Peer) bool {
	return a.Driver && b.Driver && a.Name != b.Name && before(a, b)
}

// MessageKind is the type of a protocol message between members.
type MessageKind uint8

// The protocol's messages. They travel over an unreliable network: any may
// be lost, duplicated, delayed or reordered.
const (
	// MsgEpoch, proposer → worker: World is the newest epoch. Final, on one
	// to a worker World leaves out, says it will not be admitted again (the
	// driver evicted it, or training is over): it should not come back as a
	// new member.
	MsgEpoch MessageKind = iota + 1
	// MsgFailure, worker → proposer: a collective of epoch Number failed,
	// blaming member Blamed ("" when none) with Cause.
	MsgFailure
	// MsgPing, proposer → worker: are you alive? (liveness probe, Nonce).
	MsgPing
	// MsgPong, worker → proposer: the answer to ping Nonce, with World, the
	// newest epoch the worker knows (a worker taking over proposing learns
	// from these where the numbering stands). With Nonce 0 it answers no
	// ping: it acknowledges an epoch received (the proposer stops re-sending
	// it there).
	MsgPong
	// MsgDone, worker → proposer: training finished at epoch Number.
	MsgDone
)

func (k MessageKind) String() string {
	switch k {
	case MsgEpoch:
		return "epoch"
	case MsgFailure:
		return "failure"
	case MsgPing:
		return "ping"
	case MsgPong:
		return "pong"
	case MsgDone:
		return "done"
	}
	return fmt.Sprintf("MessageKind(%d)", uint8(k))
}

// Message is one protocol message; which fields are set depends on Kind.
// Package sync/control encodes it on the wire.
type Message struct {
	Kind   MessageKind
	World  World  // epoch, pong
	Number uint64 // failure, done
	Blamed string // failure
	Cause  string // failure
	Nonce  uint64 // ping, pong
	Final  bool   // epoch, to a worker left out for good
}

func (m Message) String() string {
	switch m.Kind {
	case MsgEpoch:
		if m.Final {
			return "epoch " + m.World.describe() + " (out for good)"
		}
		return "epoch " + m.World.describe()
	case MsgFailure:
		return fmt.Sprintf("failure in %d blaming %q", m.Number, m.Blamed)
	case MsgPing:
		return fmt.Sprintf("ping %d", m.Nonce)
	case MsgPong:
		return fmt.Sprintf("pong %d (knows %s)", m.Nonce, m.World.describe())
	case MsgDone:
		return fmt.Sprintf("done at %d", m.Number)
	}
	return m.Kind.String()
}

// describe prints a world with its member names, for traces and test output.
func (w World) describe() string {
	names := make([]string, len(w.Members))
	for i, m := range w.Members {
		names[i] = m.Name
	}
	return fmt.Sprintf("%d[%s]", w.Number, strings.Join(names, " "))
}

// Equal reports whether two worlds have the same number and members.
func (w World) Equal(o World) bool { return w.Number == o.Number && slices.Equal(w.Members, o.Members) }

// Input is what a state machine of the protocol (Proposer, Follower) is told:
// one of PeerSeen, PeerGone, Exited, Received, SendFailed, Evict, SetMinWorkers,
// SetFirstWorld, ReportFailure, ReportDone.
type Input interface{ input() }

// PeerSeen: a member joined the cluster or published new metadata (the
// membership layer's joined and updated events).
type PeerSeen struct{ Peer Peer }

// PeerGone: a member left gracefully (Failed false) or was declared dead.
type PeerGone struct {
	Name   string
	Failed bool
}

// Exited: the process of worker Name is known to have ended (its launcher
// saw it exit, or its gossip port refused a connection): unlike a death that
// gossip declares, which may be a partition or a stall, it is no longer a
// voter of the quorum (CheckQuorum). It leaves the next world like a failed
// member.
type Exited struct{ Name string }

// Received: a message arrived from member From.
type Received struct {
	From string
	Msg  Message
}

// SendFailed: a Send output could not be delivered (the caller reports it
// when it knows; a lost message need not be reported).
type SendFailed struct {
	To  string
	Msg Message
}

// Evict: the driver's decision to take a worker out of the job for good (a
// scale-down); it is never admitted again. Lost says why, when the launcher
// takes it out because it lost the worker's process or host (its ssh
// connection broke): then a failure of the current world is explained, and
// the next world is formed without probing every member first (see
// Proposer's census).
type Evict struct {
	Name string
	Lost bool
}

// SetMinWorkers: no world with fewer members is proposed from now on.
type SetMinWorkers struct{ N int }

// SetFirstWorld: the voters of the job's first world are N from now on
// (ProposerConfig.FirstWorld): the job's first workers less those known to
// be gone. It changes nothing once a world exists.
type SetFirstWorld struct{ N int }

// ReportFailure (Follower): a collective of this worker's epoch Number
// failed, blaming member Blamed ("" when none).
type ReportFailure struct {
	Number uint64
	Blamed string
	Cause  string
}

// ReportDone (Follower): training finished on this worker, at epoch Number.
type ReportDone struct{ Number uint64 }

func (PeerSeen) input()      {}
func (PeerGone) input()      {}
func (Received) input()      {}
func (Exited) input()        {}
func (SendFailed) input()    {}
func (Evict) input()         {}
func (SetMinWorkers) input() {}
func (SetFirstWorld) input() {}
func (ReportFailure) input() {}
func (ReportDone) input()    {}

// Output is what a state machine asks its caller to do, or tells it: Send,
// Proposed, Adopted, OutForGood and Finished are the protocol's; the others (Waiting,
// NoQuorum, Removed, Suspected, Cleared, Rescued, TookOver, SteppedDown, Unroutable,
// Ignored, Refused) record decisions, for logs and observers.
type Output interface{ output() }

// Send: deliver Msg to member To.
type Send struct {
	To  string
	Msg Message
}

// Proposed: World is a new epoch (its announcements follow as Sends).
type Proposed struct{ World World }

// Adopted (Follower): World is the newest epoch this worker has heard of;
// its session moves to it.
type Adopted struct{ World World }

// OutForGood (Follower): the proposer said that this worker, left out of
// epoch Number, will not be admitted again (the driver evicted it, or training
// is over); it must not come back as a new member. It comes before the
// Adopted of that epoch.
type OutForGood struct{ Number uint64 }

// Finished: member By reported that training is over, at epoch Number. The
// first one ends admissions: the job is finishing.
type Finished struct {
	By     string
	Number uint64
}

// Waiting: a change is pending, but a world needs Min members and there are
// Have.
type Waiting struct{ Have, Min int }

// NoQuorum: a change is pending, but the world it would make lacks the
// quorum of Base (see CheckQuorum): Missing are only suspected of being
// gone, not known to be. Nothing is proposed; the members wait.
type NoQuorum struct {
	Base   uint64
	Quorum Quorum
}

// Removed: Name leaves the desired membership; the next epoch is without it.
type Removed struct {
	Name string
	Why  Reason
}

// Suspected: By reported a failed collective of epoch Number blaming Name; a
// liveness probe follows (blame alone is not proof).
type Suspected struct {
	Name, By string
	Number   uint64
	Cause    string
}

// Cleared: Name, blamed for a failure, proved alive (it answered its probe or
// sent anything) or, removed on suspicion, is still ready after the cool-down:
// it stays, or is admitted again.
type Cleared struct{ Name string }

// Rescued: training finished, but members of epoch Number that did not
// finish failed its last step: the next world is without the Finished ones,
// however small.
type Rescued struct {
	Number   uint64
	Finished []string
}

// TookOver: a proposer taking over (the job has no driver) continues from
// World, the newest epoch it and the workers it heard from know; Unheard
// lists workers that did not say which epoch they know within the time
// allowed.
type TookOver struct {
	World   World
	Unheard []string
	// Adopted: the proposer is a driver that took its job back (Adopt),
	// not a worker standing in for a dead driver.
	Adopted bool
}

// SteppedDown (Follower): this worker no longer proposes (a driver or an
// older worker is back in its view).
type SteppedDown struct{}

// Unroutable (Follower): a report (Msg) could not be sent: no proposer is in
// view.
type Unroutable struct{ Msg Message }

// Refused: a message from member From was dropped, for Err: its epoch
// number is out of range (ErrNumberOutOfRange), it is a report from outside
// the world it is about (ErrNotMember), a repeated report (ErrRepeated), or
// an announcement from a member that does not propose (ErrNotProposer).
type Refused struct {
	From string
	Msg  Message
	Err  error
}

// Ignored: a ready worker without a collective address cannot be placed in
// a world.
type Ignored struct {
	Name string
	Why  string
}

func (Send) output()        {}
func (Proposed) output()    {}
func (Adopted) output()     {}
func (Finished) output()    {}
func (OutForGood) output()  {}
func (Waiting) output()     {}
func (NoQuorum) output()    {}
func (Removed) output()     {}
func (Suspected) output()   {}
func (Cleared) output()     {}
func (Rescued) output()     {}
func (TookOver) output()    {}
func (SteppedDown) output() {}
func (Unroutable) output()  {}
func (Ignored) output()     {}
func (Refused) output()     {}

// Reason says why a member left the desired membership.
type Reason uint8

// The reasons for a removal.
const (
	ReasonLeaving    Reason = iota + 1 // it announced a graceful leave
	ReasonLeft                         // it left the cluster
	ReasonFailed                       // gossip declared it dead and it did not answer its probe, or its process exited
	ReasonUnanswered                   // blamed for a failure, it did not answer its probe (or is not in view)
	ReasonEvicted                      // the driver took it out for good
	ReasonFinished                     // it finished training; the others redo the last step without it
	// ReasonStuck: blamed for the failures of BlameLimit worlds in a row
	// while it answered its probes: its gossip runs, its training does not
	// (a stuck data loader, a deadlock). It may come back as a new member.
	ReasonStuck
	// ReasonLate: training finished in a world it was not a member of (it
	// was admitted as the others finished, as a cut-off worker back after
	// a partition): it never held the last step's state and is out for good.
	ReasonLate
)

func (r Reason) String() string {
	switch r {
	case ReasonLeaving:
		return "leaving"
	case ReasonLeft:
		return "left"
	case ReasonFailed:
		return "failed"
	case ReasonUnanswered:
		return "blamed and unanswered"
	case ReasonEvicted:
		return "evicted"
	case ReasonFinished:
		return "finished"
	case ReasonStuck:
		return "blamed again and again though alive (stuck)"
	case ReasonLate:
		return "training finished in a world it was not a member of"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}
