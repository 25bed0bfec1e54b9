package stats

import (
	"slices"
	"testing"
)

// A world change ends the batch at its last step, and the batch goes out
// with the next commit (or HandHeld, or Take), never merged with the next
// world's steps.
func TestWorldChangeEndsTheBatch(t *testing.T) {
	tests := []struct {
		name string
		// changeAt: the step whose commit changes the world; then, after
		// it: "commit" (the next world's first step), "hand" (HandHeld, a
		// worker left out) or "take" (Take, training over).
		changeAt int64
		then     string
		// the batches handed out, by their steps (wantBefore of them by the
		// commit that changed the world), and what Take returns last
		want       [][]int64
		wantBefore int
		wantTake   []int64
	}{
		{name: "the next commit hands it out", changeAt: 3, then: "commit", want: [][]int64{{1, 2, 3}}, wantTake: []int64{4}},
		{name: "a worker left out hands it out at once", changeAt: 3, then: "hand", want: [][]int64{{1, 2, 3}}},
		{name: "training over: Take has it", changeAt: 3, then: "take", wantTake: []int64{1, 2, 3}},
		{name: "a full batch before the change goes out as usual", changeAt: 12, then: "commit", want: [][]int64{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {11, 12}}, wantBefore: 1, wantTake: []int64{13}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got [][]int64
			c := NewClock(10, func(b Batch) {
				var steps []int64
				for _, s := range b.Steps {
					steps = append(steps, s.Step)
				}
				got = append(got, steps)
			})
			c.lastFlush = c.lastFlush.Add(-minInterval) // a full batch may go out at once
			for step := int64(1); step <= tc.changeAt; step++ {
				c.Commit(1, step, step == tc.changeAt)
			}
			if n := len(got); n != tc.wantBefore {
				t.Fatalf("%d batches handed out by the commit that changed the world (%v), want them all but the last world's", n, got)
			}
			switch tc.then {
			case "commit":
				c.Commit(2, tc.changeAt+1, false)
			case "hand":
				c.HandHeld()
				c.HandHeld() // once only
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Fatalf("batches %v, want %v", got, tc.want)
			}
			b, _ := c.Take()
			var taken []int64
			for _, s := range b.Steps {
				taken = append(taken, s.Step)
			}
			if !slices.Equal(taken, tc.wantTake) {
				t.Fatalf("Take returned steps %v, want %v", taken, tc.wantTake)
			}
		})
	}
}
