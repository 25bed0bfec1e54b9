package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// TestSIGTERMStorms preempts workers again and again, several at once, as a
// spot market reclaiming capacity does: each storm sends SIGTERM to 1 to 3
// of the job's 4 workers together. A storm of 2 or 3 leaves fewer workers
// than --min-np 3, so the driver cannot let them go at once: the runner
// starts replacements to restore the minimum, and a leaver the job cannot
// release in time leaves when its notice runs out, its last step
// committed. Every preempted worker must be gone within its notice; the
// fixed-schedule heuristic brings the job back to 4 workers after each
// storm; the job must finish with the workers agreeing on the parameters at
// every step and every sample of each data epoch trained on once.
func TestSIGTERMStorms(t *testing.T) {
	const samples, steps = 1200, 1500
	const notice = 3 * time.Second
	h := e2e.StartRunJob(t, "--np", "4", "--min-np", "3", "--heuristic", "fixed-schedule", "--heuristic-opt", "schedule=0:4",
		"--leave-notice", notice.String(), "--", e2e.Synthetic,
		"--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "1ms", "-v")
	h.LogTailOnFailure(t, "gorovod run's log")
	h.WaitFor(t, "step 20 in a world of 4", time.Minute, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 && e2e.LastSize(l) == 4 })
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("storm seed %d", seed)
	signalled := map[int]bool{}
	for round, size := range []int{2, 1, 3, 2} {
		h.Mu.Lock()
		var alive []int
		for i, pid := range h.Pids {
			if !signalled[i] && !e2e.ProcessGone(pid) {
				alive = append(alive, i)
			}
		}
		at := e2e.MaxStep(h.Lines)
		h.Mu.Unlock()
		if at >= steps-200 {
			t.Logf("training nearly over at step %d: storms end", at)
			break
		}
		slices.Sort(alive)
		rng.Shuffle(len(alive), func(a, b int) { alive[a], alive[b] = alive[b], alive[a] })
		victims := alive[:min(size, len(alive)-1)]
		t0 := time.Now()
		for _, i := range victims {
			signalled[i] = true
			if err := syscall.Kill(h.Pid(t, i), syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}
		for _, i := range victims {
			pid := h.Pid(t, i)
			for !e2e.ProcessGone(pid) {
				if time.Since(t0) > notice+time.Second {
					t.Fatalf("storm %d: worker %d (pid %d) still running %v after its SIGTERM; its notice is %v", round, i, pid, time.Since(t0), notice)
				}
				time.Sleep(20 * time.Millisecond) // no way to wait on another process's exit
			}
			t.Logf("storm %d (step %d): worker %d gone %v after SIGTERM", round, at, i, time.Since(t0).Round(time.Millisecond))
		}
		// The victims trained in worlds up to victimsLast: a world of 4
		// after that one is a world of 4 without them.
		h.Mu.Lock()
		var victimsLast uint64
		for _, l := range h.Lines {
			if slices.Contains(victims, l.Worker) {
				victimsLast = max(victimsLast, l.WorldEpoch)
			}
		}
		h.Mu.Unlock()
		h.WaitFor(t, "a world of 4 without the victims", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
			return slices.ContainsFunc(lines, func(l e2e.TrainerLine) bool { return l.WorldEpoch > victimsLast && l.Size == 4 })
		})
		t.Logf("storm %d: a world of 4 again %v after the storm", round, time.Since(t0).Round(time.Millisecond))
	}

	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the job did not finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	log := h.Log.String()
	t.Logf("leavers that used up their notice: %d; replacements the runner started to restore the minimum: %d",
		strings.Count(log, "leave notice r"), strings.Count(log, "fewer than its minimum 3: started"))
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// TestEveryWorkerPreempted tells every worker of a job to go at once, as
// when the whole job is preempted — each worker SIGTERMed, or gorovod run
// itself (a Slurm time limit signals the batch script too): no world can form
// without them, so each leaves when its notice runs out, at a step boundary.
// The runner must not start replacements for them (they would train over
// from scratch: nobody is left to copy the state from); the job ends with
// every worker's last step the same committed step, with the same
// parameters.
func TestEveryWorkerPreempted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		preempt func(t *testing.T, h *e2e.RunJobHarness)
		// the runner's notice when the shortage shows before it knows why
		noReplacementsNotice bool
	}{
		{"every worker SIGTERMed", func(t *testing.T, h *e2e.RunJobHarness) {
			for i := range 3 {
				if err := syscall.Kill(h.Pid(t, i), syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
		}, true},
		{"gorovod run SIGTERMed", func(t *testing.T, h *e2e.RunJobHarness) {
			if err := h.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { everyWorkerPreempted(t, tc.preempt, tc.noReplacementsNotice) })
	}
}

func everyWorkerPreempted(t *testing.T, preempt func(*testing.T, *e2e.RunJobHarness), noReplacementsNotice bool) {
	const samples = 1200
	const notice = 3 * time.Second
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--leave-notice", notice.String(), "--", e2e.Synthetic,
		"--steps", "100000", "--json", "--samples", fmt.Sprint(samples), "--batch", "24", "--model-size", "20000", "--compute", "1ms", "-v")
	h.LogTailOnFailure(t, "gorovod run's log")
	h.WaitFor(t, "step 60 in a world of 3", time.Minute, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 60 && e2e.LastSize(l) == 3 })
	t0 := time.Now()
	preempt(t, h)
	select {
	case err := <-h.Exited:
		t.Logf("gorovod run exited %v after the SIGTERMs (%v)", time.Since(t0).Round(time.Millisecond), err)
	case <-time.After(notice + 10*time.Second):
		t.Fatalf("the job still runs %v after every worker was told to go (notice %v)", time.Since(t0), notice)
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	log := h.Log.String()
	if strings.Contains(log, " started\n") {
		t.Errorf("the runner started workers after every worker was told to go")
	}
	if noReplacementsNotice && !strings.Contains(log, "every worker of the job's world is leaving or gone: no replacements") {
		t.Errorf("gorovod run did not say why it starts no replacements")
	}
	// The driver lets leavers go while the world stays at its minimum; the
	// members of the last world could not go that way: each left as its
	// notice ran out, and they agree on their last committed step.
	lastOf := map[int]e2e.TrainerLine{}
	var final uint64
	for _, l := range h.Lines {
		lastOf[l.Worker] = l
		final = max(final, l.WorldEpoch)
	}
	var stayed []int
	for i, l := range lastOf {
		if l.WorldEpoch == final {
			stayed = append(stayed, i)
		}
	}
	slices.Sort(stayed)
	if len(stayed) < 2 {
		t.Fatalf("the last world (epoch %d) had workers %v, want at least the minimum 2", final, stayed)
	}
	first := lastOf[stayed[0]]
	for _, i := range stayed {
		if l := lastOf[i]; l.Step != first.Step || l.Params != first.Params {
			t.Errorf("worker %d ended at step %d (%.12s), worker %d at step %d (%.12s)", i, l.Step, l.Params, stayed[0], first.Step, first.Params)
		}
	}
	if n := strings.Count(log, "leave notice r"); n != len(stayed) { // "running out", "ran out during the step"
		t.Errorf("%d leave notices ran out, want %d (the last world's members)", n, len(stayed))
	}
	t.Logf("workers %v of the last world ended at step %d as their notices ran out", stayed, first.Step)
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, e2e.MaxStep(h.Lines))
}
