package epoch

import (
	"errors"
	"fmt"
)

// Bounds on the epoch numbers the machines take from messages. A number comes
// from the network, so a member could send any uint64; without bounds, a
// failure report numbered 2^64−1 raised the next proposal's number to
// 2^64−1+1 = 0, which every worker refuses (it adopts only higher numbers):
// the job was wedged for good.
const (
	// MaxNumber is the highest epoch number any machine accepts or proposes
	// (2^62): far beyond what a job reaches (an epoch every millisecond for
	// a hundred million years), and far enough below 2^64 that nothing above
	// it wraps.
	MaxNumber uint64 = 1 << 62
	// MaxLead is how far above the newest number a machine knows a number
	// from a message may be (2^20). Another proposer's epochs run a few
	// numbers ahead of this one's at most (two proposers while views
	// disagree, a takeover); a number further ahead is refused, so one
	// member cannot move the numbering to MaxNumber either. The newest
	// number known is 0 for a new proposer, and for a worker that adopted no
	// epoch yet: a job whose numbering passed MaxLead cannot be taken over
	// by a worker that never adopted an epoch (the oldest ready worker, that
	// proposes, always has).
	MaxLead uint64 = 1 << 20
)

// ErrNumberOutOfRange is wrapped by the error of a Refused message whose
// epoch number is above MaxNumber or more than MaxLead above the newest
// number the machine knows.
var ErrNumberOutOfRange = errors.New("epoch: number out of range")

// checkNumber refuses a number from a message that is over MaxNumber or over
// known+MaxLead.
func checkNumber(n, known uint64) error {
	if n > MaxNumber {
		return fmt.Errorf("%w: %d is above the maximum %d", ErrNumberOutOfRange, n, MaxNumber)
	}
	if n > known+MaxLead {
		return fmt.Errorf("%w: %d is more than %d above the newest known, %d", ErrNumberOutOfRange, n, MaxLead, known)
	}
	return nil
}

// Errors of a Refused report or announcement, besides ErrNumberOutOfRange.
var (
	// ErrNotMember: a failure report or the end of training from a worker
	// that is not a member of the current world (or, for the end of
	// training, about a world from before its current membership began).
	ErrNotMember = errors.New("epoch: report from a worker outside the world it is about")
	// ErrRepeated: a second failure report from one worker about one world;
	// only its first counts (see Proposer's blame rules).
	ErrRepeated = errors.New("epoch: repeated failure report")
	// ErrNotProposer: an epoch announced by a member that cannot be
	// proposing (see Follower).
	ErrNotProposer = errors.New("epoch: epoch announced by a member that does not propose")
)

// messageNumber is the epoch number a message carries.
func messageNumber(m Message) uint64 {
	switch m.Kind {
	case MsgEpoch, MsgPong:
		return m.World.Number
	}
	return m.Number
}
