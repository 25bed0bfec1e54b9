package epoch_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// proposerHarness drives a Proposer alone: the workers in alive answer every
// probe at once with the current world; time moves only when advance says.
type proposerHarness struct {
	t     *testing.T
	p     *epoch.Proposer
	now   time.Time
	alive map[string]bool
	outs  []epoch.Output
}

func (h *proposerHarness) step(in epoch.Input) { h.handle(h.p.Step(h.now, in)) }

func (h *proposerHarness) handle(outs []epoch.Output) {
	for _, o := range outs {
		h.outs = append(h.outs, o)
		if s, ok := o.(epoch.Send); ok && s.Msg.Kind == epoch.MsgPing && h.alive[s.To] {
			h.step(from(s.To, pong(s.Msg.Nonce, h.p.Current())))
		}
	}
}

// advance moves time on by d, ticking the proposer at each of its deadlines.
func (h *proposerHarness) advance(d time.Duration) {
	end := h.now.Add(d)
	for i := 0; ; i++ {
		dl := h.p.Deadline()
		if dl.IsZero() || dl.After(end) {
			break
		}
		if i > 1000 {
			h.t.Fatalf("the proposer's deadline does not move on (%v)", dl)
		}
		if dl.After(h.now) {
			h.now = dl
		}
		h.handle(h.p.Tick(h.now))
	}
	h.now = end
}

// take returns the outputs since the last call.
func (h *proposerHarness) take() []epoch.Output {
	o := h.outs
	h.outs = nil
	return o
}

// The proposer's side of a job that waited below its minimum with every
// worker alive: a worker removed as stuck (ReasonStuck) while the job could
// do without it is never admitted again under its name; when another member
// dies before the world without the stuck one is proposed, the job is below
// MinWorkers, no world is proposed, and so the stuck worker is never sent an
// epoch that leaves it out — its process, alive and told nothing, would wait
// as a member of the failed world for ever. Only a new member brings the job
// back to its minimum: the launcher must stop the stuck process and start
// another (package job's TestStuckWorkerIsStoppedAndReplaced; sync/driver's
// Config.OnRemoved tells it).
func TestStuckWorkerBelowTheMinimumIsNeverToldAndNeverReadmitted(t *testing.T) {
	const ms = time.Millisecond
	h := &proposerHarness{t: t, p: epoch.NewProposer(epoch.ProposerConfig{MinWorkers: 3}),
		now: time.Unix(1000, 0), alive: map[string]bool{"a": true, "b": true, "c": true, "d": true}}
	for _, name := range []string{"a", "b", "c", "d"} {
		h.step(ready(name))
	}
	h.advance(20 * ms)
	if got := h.p.Current(); !got.Equal(world(1, "a", "b", "c", "d")) {
		t.Fatalf("first world %v", got)
	}
	// b's training is stuck: a and c blame it in three worlds in a row; it
	// answers every probe.
	stuckAt := 0
	for n := uint64(1); n <= 3; n++ {
		h.step(from("a", failure(n, "b")))
		h.step(from("c", failure(n, "b")))
		if slices.Contains(h.outs, epoch.Output(epoch.Removed{Name: "b", Why: epoch.ReasonStuck})) {
			stuckAt = int(n)
			break
		}
		h.advance(20 * ms)
		if got := h.p.Current().Number; got != n+1 {
			t.Fatalf("after the failure of world %d the current world is %d, want %d\n%v", n, got, n+1, h.take())
		}
	}
	if stuckAt != 3 {
		t.Fatalf("b was not removed as stuck at its third blame (removed at %d)\n%v", stuckAt, h.take())
	}
	h.take()
	// d dies before the world without b is proposed.
	h.alive["d"] = false
	h.step(epoch.PeerGone{Name: "d", Failed: true})
	h.advance(600 * ms) // its probe goes unanswered (ProbeTimeout)
	outs := h.take()
	if !slices.Contains(outs, epoch.Output(epoch.Waiting{Have: 2, Min: 3})) {
		t.Fatalf("the proposer does not wait below its minimum:\n%v", outs)
	}
	// Every epoch b is sent still holds it: it is not told it is out.
	h.advance(3 * time.Second) // re-announcements
	outs = append(outs, h.take()...)
	for _, o := range outs {
		if s, ok := o.(epoch.Send); ok && s.To == "b" && s.Msg.Kind == epoch.MsgEpoch && s.Msg.World.Rank("b") < 0 {
			t.Fatalf("b was sent an epoch without it (%v): the premise of this test no longer holds", s.Msg)
		}
		if _, ok := o.(epoch.Proposed); ok {
			t.Fatalf("a world was proposed below the minimum: %v", o)
		}
	}
	if got := h.p.Current(); got.Number != 3 || got.Rank("b") < 0 {
		t.Fatalf("current world %v, want world 3 still holding b", got)
	}
	// b, seen ready again under its name, is not admitted.
	h.step(ready("b"))
	h.advance(50 * ms)
	for _, o := range h.take() {
		if p, ok := o.(epoch.Proposed); ok {
			t.Fatalf("b was admitted again under its name: %v", p.World)
		}
	}
	// A new member (the launcher's replacement) completes the world.
	h.alive["e"] = true
	h.step(ready("e"))
	h.advance(50 * ms)
	if got := h.p.Current(); !got.Equal(world(4, "a", "c", "e")) {
		t.Fatalf("with a replacement the world is %v, want %v\n%v", got, world(4, "a", "c", "e"), h.take())
	}
}
