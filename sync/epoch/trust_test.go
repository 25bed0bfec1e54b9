package epoch_test

import (
	"math"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// threeWorkers: a, b and c ready, epoch 1 proposed.
var threeWorkers = []step{
	{0, ready("a"), nil},
	{1 * ms, ready("b"), nil},
	{2 * ms, ready("c"), nil},
	{12 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
}

// blameRound: a blames b for world n; b answers probe nonce, and c the
// census's probe nonce+1; world n+1 is the same three.
func blameRound(at uint64, n, nonce uint64) []step {
	t := ms * time.Duration(at)
	return []step{
		{t, from("a", failure(n, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: n, Cause: "boom"}, ping("b", nonce), ping("c", nonce+1))},
		{t + 10*ms, from("b", pong(nonce, world(n, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
		{t + 10*ms, from("c", pong(nonce+1, world(n, "a", "b", "c"))), nil},
		{t + 10*ms, nil, propose(world(n+1, "a", "b", "c"), "a", "b", "c")},
	}
}

// corroboratedRound: a blames b for world n, c reports the failure of n
// blaming no one (its collective was aborted), b answers its probe; world
// n+1 is the same three.
func corroboratedRound(at uint64, n, nonce uint64) []step {
	t := ms * time.Duration(at)
	return []step{
		{t, from("a", failure(n, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: n, Cause: "boom"}, ping("b", nonce), ping("c", nonce+1))},
		{t + 1*ms, from("c", failure(n, "")), nil}, // answers c's census probe too
		{t + 10*ms, from("b", pong(nonce, world(n, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
		{t + 10*ms, nil, propose(world(n+1, "a", "b", "c"), "a", "b", "c")},
	}
}

// twoAccusersRound: a and c both blame b for world n, b answers its probe;
// world n+1 is the same three.
func twoAccusersRound(at uint64, n, nonce uint64) []step {
	t := ms * time.Duration(at)
	return []step{
		{t, from("a", failure(n, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: n, Cause: "boom"}, ping("b", nonce), ping("c", nonce+1))},
		{t + 1*ms, from("c", failure(n, "b")), outs(epoch.Suspected{Name: "b", By: "c", Number: n, Cause: "boom"})},
		{t + 10*ms, from("b", pong(nonce, world(n, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
		{t + 10*ms, nil, propose(world(n+1, "a", "b", "c"), "a", "b", "c")},
	}
}

// victimRound: like corroboratedRound, but b reports the failure too.
func victimRound(at uint64, n, nonce uint64) []step {
	t := ms * time.Duration(at)
	return []step{
		{t, from("a", failure(n, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: n, Cause: "boom"}, ping("b", nonce), ping("c", nonce+1))},
		{t + 1*ms, from("c", failure(n, "")), nil},
		{t + 2*ms, from("b", failure(n, "")), outs(epoch.Cleared{Name: "b"})}, // its report answers its probe
		{t + 10*ms, nil, propose(world(n+1, "a", "b", "c"), "a", "b", "c")},
	}
}

// TestProposerRefuses: what a member (or a forger that got past the
// membership layer) could send to wedge or mislead the proposer is refused
// with a typed error, and the job goes on.
func TestProposerRefuses(t *testing.T) {
	huge := failure(math.MaxUint64, "")
	for _, tc := range []struct {
		name   string
		script []step
	}{
		{name: "a failure report numbered 2^64-1 is refused: the next epoch is 2, not 0", script: script(twoWorkers, []step{
			{20 * ms, from("a", huge), outs(refused("a", huge, epoch.ErrNumberOutOfRange))},
			{30 * ms, nil, nil}, // nothing changed
			{40 * ms, from("a", failure(1, "")), outs(ping("b", 1))}, // the census
			{45 * ms, from("b", pong(1, world(1, "a", "b"))), nil},
			{50 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
		})},
		{name: "a number more than MaxLead ahead is refused; one within raises the numbering", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(2+epoch.MaxLead, "")), outs(refused("a", failure(2+epoch.MaxLead, ""), epoch.ErrNumberOutOfRange))},
			{21 * ms, from("b", pong(9, world(2+epoch.MaxLead, "b"))), outs(refused("b", pong(9, world(2+epoch.MaxLead, "b")), epoch.ErrNumberOutOfRange))},
			{22 * ms, from("a", epochMsg(world(epoch.MaxNumber+1, "a"))), outs(refused("a", epochMsg(world(epoch.MaxNumber+1, "a")), epoch.ErrNumberOutOfRange))},
			{30 * ms, nil, nil},
			{40 * ms, from("a", failure(1+epoch.MaxLead, "")), nil},
			{50 * ms, nil, propose(world(2+epoch.MaxLead, "a", "b"), "a", "b")},
		})},
		{name: "a failure report from outside the world is refused and raises nothing", script: script(twoWorkers, []step{
			{20 * ms, from("m", failure(1, "a")), outs(refused("m", failure(1, "a"), epoch.ErrNotMember))},
			{21 * ms, from("m", failure(5, "a")), nil}, // not in view: not even its number counts
			{40 * ms, nil, nil},
		})},
		{name: "a repeated failure report is refused: one probe, one epoch", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{25 * ms, from("a", failure(1, "b")), outs(refused("a", failure(1, "b"), epoch.ErrRepeated))},
			{26 * ms, from("a", failure(1, "a")), outs(refused("a", failure(1, "a"), epoch.ErrRepeated))},
			{40 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
		})},
		{name: "the end of training from outside the world, or about a world before the sender's membership, is refused: the job goes on", script: script(twoWorkers, []step{
			{12 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{22 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")},
			{30 * ms, from("c", done(1)), outs(refused("c", done(1), epoch.ErrNotMember))},
			{31 * ms, from("m", done(2)), outs(refused("m", done(2), epoch.ErrNotMember))},
			{1022 * ms, nil, sendEpoch(world(2, "a", "b", "c"), "a", "b", "c")}, // not finished: all still told
			// a member since world 1 may report world 1 (it finished before it heard of 2);
			// c, admitted in world 2, never trained in world 1: it is out.
			{1030 * ms, from("a", done(1)), outs(epoch.Finished{By: "a", Number: 1}, epoch.Removed{Name: "c", Why: epoch.ReasonLate})},
		})},
		{name: "a flood of blame from one member does not remove a healthy worker: no other member reports those worlds failing", script: script(threeWorkers,
			blameRound(20, 1, 1), blameRound(40, 2, 3), blameRound(60, 3, 5), blameRound(80, 4, 7),
			[]step{
				{100 * ms, from("a", failure(5, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 5, Cause: "boom"}, ping("b", 9), ping("c", 10))},
				{101 * ms, from("a", failure(5, "c")), outs(refused("a", failure(5, "c"), epoch.ErrRepeated))},
				{102 * ms, from("c", failure(5, "b")), outs(epoch.Suspected{Name: "b", By: "c", Number: 5, Cause: "boom"})}, // still probed, not removed
			})},
		{name: "a worker blamed in three worlds in a row whose failure another member reported too, and it did not, is stuck", script: script(threeWorkers,
			corroboratedRound(20, 1, 1), corroboratedRound(40, 2, 3),
			[]step{
				{60 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, epoch.Removed{Name: "b", Why: epoch.ReasonStuck}, ping("c", 5))},
			})},
		{name: "a worker blamed by two members in three worlds in a row is stuck", script: script(threeWorkers,
			twoAccusersRound(20, 1, 1), twoAccusersRound(40, 2, 3),
			[]step{
				{60 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, epoch.Removed{Name: "b", Why: epoch.ReasonStuck}, ping("c", 5))},
			})},
		{name: "a blamed worker that reported the failure itself was a victim, not the cause", script: script(threeWorkers,
			victimRound(20, 1, 1), victimRound(40, 2, 3),
			[]step{
				{60 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, ping("b", 5), ping("c", 6))},
			})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No acknowledgements are fed: re-sends only at Reannounce.
			runScript(t, epoch.NewProposer(epoch.ProposerConfig{Resend: epoch.DefaultProposerConfig().Reannounce}), tc.script)
		})
	}
}
