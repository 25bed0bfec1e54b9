package job

import (
	"slices"
	"testing"

	"github.com/gorovod/gorovod/sync/epoch"
)

// A hand-started worker finished training when it is in the last world of
// a job whose training is over, or when the driver took it out having
// finished; it is recorded once, however many worlds it joins.
func TestHandStarted(t *testing.T) {
	last := epoch.World{Members: []epoch.Member{{Name: "in"}, {Name: "in-early"}}}
	for _, tc := range []struct {
		name         string
		trainingOver bool
		early        []string
		want         []HandStartedWorker
	}{
		{"training over", true, nil, []HandStartedWorker{
			{Name: "in", InLastWorld: true, Finished: true}, {Name: "in-early", InLastWorld: true, Finished: true},
			{Name: "out", InLastWorld: false, Finished: false}}},
		{"training not over", false, nil, []HandStartedWorker{
			{Name: "in", InLastWorld: true}, {Name: "in-early", InLastWorld: true}, {Name: "out"}}},
		{"taken out having finished", false, []string{"in-early", "out"}, []HandStartedWorker{
			{Name: "in", InLastWorld: true}, {Name: "in-early", InLastWorld: true, Finished: true},
			{Name: "out", Finished: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandStarted()
			for _, name := range []string{"in", "in-early", "in", "out", "in-early"} {
				h.add(name)
			}
			for _, name := range tc.early {
				h.finishedEarly(name)
			}
			if got := h.final(last, tc.trainingOver); !slices.Equal(got, tc.want) {
				t.Fatalf("final:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	h := newHandStarted()
	if !h.add("w") || h.add("w") {
		t.Fatal("add reports a member already recorded as new, or a new one as known")
	}
}
