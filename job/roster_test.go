package job

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// rosterScript plays ops on a roster that keeps keep exited records:
//
//	"+"          launch a worker that joins a world
//	"+never"     launch a worker that never joins one
//	"-I HOW"     worker I exits: finished, lost, failed, or excluded (left
//	             out of a world while it ran, then status 0)
//	"over"       a member reported the end of training
//
// and returns the roster with the order the workers exited in.
func rosterScript(t *testing.T, keep int, ops []string) (*roster, []int) {
	t.Helper()
	r := newRoster("here", keep)
	var exits []int
	world := epoch.World{Number: 1}
	for _, op := range ops {
		switch {
		case op == "over":
			r.setTrainingOver()
		case strings.HasPrefix(op, "+"):
			r.mu.Lock()
			i := r.reserveLocked("")
			r.mu.Unlock()
			name := "w" + strconv.Itoa(i)
			r.launched(i, WorkerRef{Index: i, PID: 1000 + i}, exitedProc{pid: 1000 + i}) // its Done is not used
			r.learn([]driver.WorkerInfo{{Name: name, Launch: strconv.Itoa(i)}})
			if op != "+never" {
				next := epoch.World{Number: world.Number + 1, Members: append(slices.Clone(world.Members), epoch.Member{Name: name})}
				r.followMembers(world, next)
				world = next
			}
		case strings.HasPrefix(op, "-"):
			var i int
			var how string
			if _, err := fmt.Sscanf(op, "-%d %s", &i, &how); err != nil {
				t.Fatalf("op %q: %v", op, err)
			}
			name := "w" + strconv.Itoa(i)
			var err error
			switch how {
			case "finished":
			case "lost":
				err = &ExitError{Code: -1, Signal: syscall.SIGKILL}
			case "failed":
				err = &ExitError{Code: 1}
			case "excluded":
				next := epoch.World{Number: world.Number + 1}
				for _, m := range world.Members {
					if m.Name != name {
						next.Members = append(next.Members, m)
					}
				}
				r.followMembers(world, next)
				world = next
			default:
				t.Fatalf("op %q: no such end", op)
			}
			r.exited(i, exitedProc{pid: 1000 + i, err: err}, false, func(*proc) {})
			r.left()
			exits = append(exits, i)
		default:
			t.Fatalf("no such op %q", op)
		}
	}
	return r, exits
}

// The roster keeps every running worker's record and the newest
// KeepExitedWorkers exited ones; the counts of how workers ended, the
// verdict and the exclusions stay exact past the bound, as a roster that
// keeps everything has them.
func TestRosterKeepsNewestExited(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep int
		ops  []string
	}{
		{"under the bound", 4, []string{"+", "+", "+", "-1 lost", "+", "-3 finished", "over", "-0 finished", "-2 finished"}},
		{"exactly the bound", 2, []string{"+", "+", "+", "-1 lost", "-2 finished", "over", "-0 finished"}},
		{"churn past the bound, the first worker running throughout", 3, []string{
			"+", "+", "+", "-1 lost", "+", "-2 lost", "+", "-3 finished", "+", "-5 lost", "+", "-4 lost", "+", "-6 failed",
			"+", "over", "-0 finished", "-7 finished", "-8 finished"}},
		{"exits out of launch order", 2, []string{"+", "+", "+", "+", "-3 lost", "-0 lost", "-2 finished", "-1 finished", "+", "over", "-4 finished"}},
		{"a dropped worker that never joined counts as stopped once training is over", 1, []string{
			"+", "+never", "-1 finished", "+", "-2 lost", "+", "over", "-0 finished", "-3 finished"}},
		{"a dropped worker that never joined, training not over", 1, []string{
			"+", "+never", "-1 finished", "+", "-2 lost", "-0 finished"}},
		{"a dropped failure still fails the job", 1, []string{"+", "+", "-1 failed", "+", "-2 lost", "over", "-0 finished"}},
		{"a dropped exclusion is still reported", 1, []string{"+", "+", "-1 excluded", "+", "-2 lost", "over", "-0 finished"}},
		{"keep one, every worker exited", 1, []string{"+", "+", "+", "-0 lost", "-1 lost", "over", "-2 finished"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bounded, exits := rosterScript(t, tc.keep, tc.ops)
			full, _ := rosterScript(t, 1<<20, tc.ops)
			last := epoch.World{}
			var got, want Outcome
			got.Workers, got.EarlierWorkers, _ = bounded.final(last)
			want.Workers, want.EarlierWorkers, _ = full.final(last)
			got.TrainingFinished, want.TrainingFinished = full.standing.trainingOver, full.standing.trainingOver
			got.LastStep, want.LastStep = 1, 1

			// Kept: every running worker and the newest keep exits.
			exited := exits[max(0, len(exits)-tc.keep):]
			var keptWant []WorkerRecord
			for _, w := range want.Workers {
				if w.State == Running || slices.Contains(exited, w.Index) {
					keptWant = append(keptWant, w)
				}
			}
			if !slices.EqualFunc(got.Workers, keptWant, func(a, b WorkerRecord) bool {
				return a.Index == b.Index && a.State == b.State && a.Excluded == b.Excluded
			}) {
				t.Fatalf("kept %v\nwant %v", brief(got.Workers), brief(keptWant))
			}
			if n := len(bounded.exitOrder); n > tc.keep {
				t.Fatalf("%d exited records kept, bound %d", n, tc.keep)
			}
			if got.Launched() != len(want.Workers) {
				t.Fatalf("%d launched (%d kept, %+v earlier), want %d", got.Launched(), len(got.Workers), got.EarlierWorkers, len(want.Workers))
			}
			for s := Running; s <= Unknown; s++ {
				if g, w := got.Count(s), want.Count(s); g != w {
					t.Errorf("%d %v, want %d (kept %v, earlier %+v)", g, s, w, brief(got.Workers), got.EarlierWorkers)
				}
			}
			leftOut := got.EarlierWorkers.LeftOut
			for _, w := range got.Workers {
				if w.Excluded > 0 {
					leftOut++
				}
			}
			wantLeftOut := 0
			for _, w := range want.Workers {
				if w.Excluded > 0 {
					wantLeftOut++
				}
			}
			if leftOut != wantLeftOut {
				t.Errorf("%d workers left out of a world, want %d", leftOut, wantLeftOut)
			}
			if g, w := got.Err(), want.Err(); (g == nil) != (w == nil) || errors.Is(g, ErrFailed) != errors.Is(w, ErrFailed) {
				t.Errorf("verdict %v, want %v", g, w)
			}
			// The dropped workers' member names are forgotten: the roster
			// holds no more names than records.
			if len(bounded.byName) > len(bounded.procs) {
				t.Errorf("%d member names for %d records", len(bounded.byName), len(bounded.procs))
			}
		})
	}
}

// A worker that publishes the launch index of a process whose record was
// dropped is the job's (it has exited), not a worker started by hand.
func TestRosterDroppedIsNotHandStarted(t *testing.T) {
	r, _ := rosterScript(t, 1, []string{"+", "+", "-1 lost", "+", "-2 lost"})
	gone := driver.WorkerInfo{Name: "w1", Launch: "1"}
	if p, ours := r.matchLocked(gone); p != nil || !ours {
		t.Fatalf("dropped worker 1: %v, ours %v; want no record, ours", p, ours)
	}
	if n := r.count([]driver.WorkerInfo{gone, {Name: "byhand"}}); n != 2 {
		t.Fatalf("count %d, want 2 (worker 0 running, one started by hand)", n)
	}
	if g := r.firstGone(3); g != 2 {
		t.Fatalf("firstGone(3) = %d, want 2", g)
	}
}

func brief(ws []WorkerRecord) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "%d:%v ", w.Index, w.State)
	}
	return b.String()
}
