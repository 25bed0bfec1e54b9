package epoch_test

import (
	"slices"
	"testing"

	"github.com/gorovod/gorovod/sync/epoch"
)

// TestProposerFinishAsTheCutOffPairReturns is the end of a job whose cut-off
// half comes back as the other half finishes: a and b train on in world 2
// while c and d are cut off; the link heals and world 3 admits c and d
// again, but a finishes training in world 2 before anyone enters world 3.
// c and d never trained with a and b since world 1: their state is from
// before the cut. A world of theirs would train on from it (redoing steps
// the job has done, or starting far behind), and the rescue of the last step
// used to give them one. They are out for good instead (told so, and not
// listed as unfinished, so the launcher waits for nobody); only a member of
// the world training finished in redoes its last step.
func TestProposerFinishAsTheCutOffPairReturns(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failing: members of world 2 whose last step failed (they did not
		// finish; they report the failure of the newest world, which they
		// cannot connect without a).
		failing    []string
		want       []string // the worlds proposed once a finished
		unfinished []string // Proposer.Unfinished at the end
	}{
		{name: "a and b finished: c and d are out", want: []string{"a b"}},
		{name: "b failed the last step: b redoes it alone", failing: []string{"b"}, want: []string{"a b", "b"}, unfinished: []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := driverWith(t, "a", "b", "c", "d")
			h.live["c"], h.live["d"] = false, false
			h.carry(h.p.Step(h.now, epoch.PeerGone{Name: "c", Failed: true}))
			h.step(epoch.PeerGone{Name: "d", Failed: true})
			h.live["c"], h.live["d"] = true, true
			h.carry(h.p.Step(h.now, readyPeer("c")))
			h.step(readyPeer("d"))
			if want := []string{"a b", "a b c d"}; !slices.Equal(h.proposed, want) {
				t.Fatalf("setup: proposed %q, want %q", h.proposed, want)
			}
			h.proposed = nil
			// a (and b, unless its last step failed) finished in world 2
			// and exit.
			h.step(epoch.Received{From: "a", Msg: epoch.Message{Kind: epoch.MsgDone, Number: 2}})
			if !slices.Contains(tc.failing, "b") {
				h.step(epoch.Received{From: "b", Msg: epoch.Message{Kind: epoch.MsgDone, Number: 2}})
			}
			h.live["a"] = false
			for _, name := range []string{"c", "d"} {
				h.step(epoch.Received{From: name, Msg: epoch.Message{Kind: epoch.MsgFailure, Number: 3, Blamed: "a", Cause: "a is gone"}})
			}
			for _, name := range tc.failing {
				// It waits for a newer world than 2, and cannot connect
				// the newest one without a.
				n := h.p.Current().Number
				h.step(epoch.Received{From: name, Msg: epoch.Message{Kind: epoch.MsgFailure, Number: n, Blamed: "a", Cause: "a is gone"}})
			}
			h.step(epoch.PeerGone{Name: "a"})
			if !h.p.Finished() {
				t.Fatal("training is not over")
			}
			if !slices.Equal(h.proposed, tc.want) {
				t.Errorf("proposed %q once a finished, want %q", h.proposed, tc.want)
			}
			if got := h.p.Unfinished(); !slices.Equal(got, tc.unfinished) {
				t.Errorf("unfinished: %q, want %q", got, tc.unfinished)
			}
			for _, name := range []string{"c", "d"} {
				if !slices.Contains(h.final, name) {
					t.Errorf("%s was not told that it is out for good (told: %q)", name, h.final)
				}
			}
		})
	}
}
