package main

import (
	"strings"
	"testing"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// The agreement check of the Fashion-MNIST tests compares the workers of one
// world, not every line of a step number: under load, gossip declared a
// live worker dead, the two workers trained steps 329 to 336 apart (worker 1
// alone in world 3) and met again in world 6, which took worker 0's state
// and rolled worker 1 back to step 328 (a run of TestFashionMNISTUnderGoodput
// at load 30; the hashes below are that run's). Compared by step number
// alone, the discarded steps read as workers disagreeing.
func TestAgreementIsCheckedPerWorld(t *testing.T) {
	step := func(step int64, worker, rank, size int, world uint64, rank0, params string) e2e.TrainerLine {
		return e2e.TrainerLine{Step: step, Worker: worker, Rank: rank, Size: size, WorldEpoch: world, WorldRank0: rank0, Params: params}
	}
	for _, tc := range []struct {
		name  string
		lines []e2e.TrainerLine
		agree bool
	}{
		{"workers of one world agree", []e2e.TrainerLine{
			step(329, 0, 0, 2, 6, "w0", "498650594a5a"), step(329, 1, 1, 2, 6, "w0", "498650594a5a"),
			step(330, 0, 0, 2, 6, "w0", "6055271cb94e"), step(330, 1, 1, 2, 6, "w0", "6055271cb94e"),
		}, true},
		{"a step rolled back and run again in another world", []e2e.TrainerLine{
			step(329, 1, 0, 1, 3, "w1", "39c7d2e62ee0"),
			step(330, 1, 0, 1, 3, "w1", "d9b356e40ba2"),
			step(329, 0, 0, 2, 6, "w0", "498650594a5a"), step(329, 1, 1, 2, 6, "w0", "498650594a5a"),
			step(330, 0, 0, 2, 6, "w0", "6055271cb94e"), step(330, 1, 1, 2, 6, "w0", "6055271cb94e"),
		}, true},
		{"two workers cut off from each other number their worlds alike", []e2e.TrainerLine{
			step(340, 0, 0, 1, 9, "w0", "aaaaaaaaaaaa"),
			step(340, 1, 0, 1, 9, "w1", "bbbbbbbbbbbb"),
		}, true},
		{"workers of one world disagree", []e2e.TrainerLine{
			step(421, 0, 0, 2, 2, "w0", "498650594a5a"), step(421, 1, 1, 2, 2, "w0", "6055271cb94e"),
		}, false},
		{"workers of one world disagree after agreeing", []e2e.TrainerLine{
			step(420, 0, 0, 2, 2, "w0", "498650594a5a"), step(420, 1, 1, 2, 2, "w0", "498650594a5a"),
			step(421, 1, 1, 2, 2, "w0", "6055271cb94e"), step(421, 0, 0, 2, 2, "w0", "d9b356e40ba2"),
		}, false},
		{"a trainer without world_rank0: compared per world epoch", []e2e.TrainerLine{
			step(7, 0, 0, 2, 4, "", "498650594a5a"), step(7, 1, 1, 2, 4, "", "6055271cb94e"),
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, ok := e2e.Disagreement(tc.lines)
			if ok != tc.agree {
				t.Fatalf("agreement %v, want %v (%s)", ok, tc.agree, msg)
			}
			if !ok && !strings.Contains(msg, "hold different parameters") {
				t.Fatalf("the failure does not say what differed: %s", msg)
			}
		})
	}
}
