package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// TestElasticRunSurvivesEvents runs the synthetic trainer under `gorovod run`
// and puts it through every membership event the issue names: a worker added
// mid-run, a graceful SIGTERM, a kill -9 during training and a SIGSTOP. The
// workers must agree on the parameters at every step, never go back more
// than the interrupted step, and process every sample of a data epoch once.
func TestElasticRunSurvivesEvents(t *testing.T) {
	const samples = 1500
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--", e2e.Synthetic,
		"--steps", "500", "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "30",
		"--model-size", "20000", "--compute", "1ms")
	h.WaitFor(t, "step 20", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 })

	// 1. Add a worker (the launcher's SIGUSR1): the world grows to 4.
	start := time.Now()
	if err := h.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "a 4-worker world", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) == 4 })
	t.Logf("worker added: 4-worker steps after %v", time.Since(start))

	// 2. SIGTERM worker 1: it leaves gracefully, the world shrinks to 3.
	h.Mu.Lock()
	s := e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	start = time.Now()
	syscall.Kill(h.Pid(t, 1), syscall.SIGTERM)
	h.WaitFor(t, "a 3-worker world after SIGTERM", 60*time.Second, e2e.SizeAfter(s, 3))
	t.Logf("graceful leave: 3-worker steps after %v", time.Since(start))

	// 3. kill -9 worker 2 while the others train: 2 workers remain.
	h.Mu.Lock()
	s = e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	start = time.Now()
	syscall.Kill(h.Pid(t, 2), syscall.SIGKILL)
	h.WaitFor(t, "a 2-worker world after kill -9", 60*time.Second, e2e.SizeAfter(s, 2))
	t.Logf("kill -9: training resumed with 2 workers after %v", time.Since(start))

	// 4. Grow again, then freeze worker 0 with SIGSTOP.
	h.Cmd.Process.Signal(syscall.SIGUSR1)
	h.Mu.Lock()
	s = e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	h.WaitFor(t, "a 3-worker world again", 60*time.Second, e2e.SizeAfter(s, 3))
	h.Mu.Lock()
	s = e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	start = time.Now()
	syscall.Kill(h.Pid(t, 0), syscall.SIGSTOP)
	h.WaitFor(t, "a 2-worker world after SIGSTOP", 60*time.Second, e2e.SizeAfter(s, 2))
	t.Logf("SIGSTOP: training resumed with 2 workers after %v", time.Since(start))
	syscall.Kill(h.Pid(t, 0), syscall.SIGKILL)

	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	checkElasticInvariants(t, h.Lines, samples)
}

func checkElasticInvariants(t *testing.T, lines []e2e.TrainerLine, samples int) {
	t.Helper()
	e2e.CheckElasticInvariantsSteps(t, lines, samples, 500)
}

func TestRunBadCommandLines(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "no trainer command"},
		{[]string{"run", "--np", "0", "--", "true"}, "at least 1"},
		{[]string{"run", "--np", "2", "--min-np", "3", "--", "true"}, "--min-np"},
		{[]string{"run", "--np", "3", "--max-np", "2", "--", "true"}, "--max-np"},
		// horovodrun's names set the same values as gorovod's.
		{[]string{"run", "--num-proc", "0", "--", "true"}, "at least 1"},
		{[]string{"run", "--num-proc", "2", "--min-num-proc", "3", "--", "true"}, "--min-np"},
		{[]string{"run", "--np", "3", "--max-num-proc", "2", "--", "true"}, "--max-np"},
		{[]string{"run", "--", "/nonexistent/trainer"}, `trainer "/nonexistent/trainer": no such file or directory` + "\n"},
		{[]string{"run", "--", "no-such-trainer-here"}, `trainer "no-such-trainer-here": no such command in $PATH` + "\n"},
		{[]string{"run", "--", "/"}, `trainer "/": is a directory` + "\n"},
		{[]string{"run", "--placement", "everywhere", "--", "true"}, "unknown placement"},
		{[]string{"run", "--heuristic", "nope", "--", "true"}, `unknown heuristic "nope"`},
		{[]string{"run", "--heuristic-opt", "threshold=0.2", "--", "true"}, "--heuristic-opt needs --heuristic"},
		{[]string{"run", "--heuristic", "scaling-efficiency", "--heuristic-opt", "treshold=0.2", "--", "true"}, `unknown field "treshold"`},
		{[]string{"run", "--heuristic", "scaling-efficiency", "--heuristic-opt", "threshold", "--", "true"}, "not key=value"},
		{[]string{"run", "--heuristic", "utility-cost", "--", "true"}, "price_per_worker_hour"},
		{[]string{"run", "--heuristic", "hold", "--heuristic-config", "x.json", "--", "true"}, "not both"},
		{[]string{"run", "--heuristic-config", "/nonexistent/h.json", "--", "true"}, "no such file"},
		{[]string{"run", "--progress", "sometimes", "--", "true"}, "--progress"},
		{[]string{"run", "--straggler-threshold", "1.5", "--", "true"}, "threshold"},
		{[]string{"run", "--skip-steps", "-1", "--", "true"}, "--skip-steps"},
		{[]string{"run", "--slurm", "--kubernetes", "--", "true"}, "not both"},
		{[]string{"run", "--slurm-arg", "--gres=gpu:1", "--", "true"}, "need --slurm"},
		{[]string{"run", "--kubernetes-image", "img", "--", "true"}, "need --kubernetes"},
		{[]string{"run", "--leave-notice", "-1s", "--", "true"}, "--leave-notice"},
		{[]string{"run", "-H", "h1:x", "--", "true"}, `slots "x"`},
		{[]string{"run", "--hostfile", "/nonexistent/hosts", "--", "true"}, "--hostfile"},
		{[]string{"run", "-H", "a:1", "--host-discovery-script", "x", "--", "true"}, "give one of"},
		{[]string{"run", "-H", "a:1", "-p", "70000", "--", "true"}, "--ssh-port"},
		{[]string{"run", "--network-interface", "nosuch0", "--", "true"}, "--network-interface"},
		{[]string{"run", "-H", "a:1", "--ssh-option", "-oProxyCommand=x", "--", "true"}, "want Name=value"},
		{[]string{"run", "--start-timeout", "0", "--", "true"}, "positive"},
		{[]string{"run", "--blacklist-cooldown-range", "10", "--", "true"}, "MIN,MAX"},
		{[]string{"run", "--lanes", "99", "--", "true"}, "--lanes 99"},
		{[]string{"run", "--output-dir", "/dev/null/job", "--", "true"}, "--output-dir /dev/null/job: mkdir /dev/null: not a directory\n"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errs, code := runGorovod(t, tc.args...)
			if code != 2 || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q (want %q)", code, errs, tc.want)
			}
		})
	}
}

// A trainer that is a file but not a program is refused, saying how to run
// it when it is a Python script.
func TestRunTrainerNotExecutable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, want string }{
		{"train.py", `": not executable (run it with its interpreter: -- python3 ` + filepath.Join(dir, "train.py") + ")\n"},
		{"train", `": not executable (permission denied)` + "\n"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte("print('hi')\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, errs, code := runGorovod(t, "run", "--", path)
		if want := "gorovod run: trainer \"" + path + tc.want; code != 2 || !strings.HasPrefix(errs, want) {
			t.Errorf("exit %d, stderr %q; want 2, %q", code, errs, want)
		}
	}
}

// A trainer that fails at once fails the job, and the job's first lines
// (which job, how to add a worker, its directory, its workers) come before
// what became of its workers, though the first may fail before the second
// is launched.
func TestRunFailingTrainerFailsJob(t *testing.T) {
	_, errs, code := runGorovod(t, "run", "--np", "2", "--", "false")
	if code != 1 || !strings.Contains(errs, "job failed") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	lines := strings.Split(errs, "\n")
	at := func(prefix string) int {
		return slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "gorovod run: "+prefix) })
	}
	news := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, ") failed: ") })
	if news < 0 {
		t.Fatalf("no worker failed, says the output:\n%s", errs)
	}
	if first := at("job "); first != 0 {
		t.Errorf("the job's line is line %d, want the first:\n%s", first, errs)
	}
	for _, banner := range []string{"job ", "add a worker with", "job directory", "worker 0 pid", "worker 1 pid"} {
		if i := at(banner); i < 0 || i > news {
			t.Errorf("%q is line %d, after the first worker's end (line %d):\n%s", banner, i, news, errs)
		}
	}
	// Every line is gorovod run's: the job's error lists each failed worker
	// on a line of its own.
	for _, l := range lines {
		if l != "" && !strings.HasPrefix(l, "gorovod run: ") {
			t.Errorf("a line without the prefix %q: %q\n%s", "gorovod run: ", l, errs)
		}
	}
}

// TestElasticRunFaultInjection kills a random worker with kill -9 at random
// moments, again and again, adding a replacement each time, and then lets the
// job finish: it must, with every invariant intact.
func TestElasticRunFaultInjection(t *testing.T) {
	const samples, steps = 1200, 400
	h := e2e.StartRunJob(t, "--np", "4", "--min-np", "2", "--", e2e.Synthetic,
		"--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "1ms", "-v")
	h.WaitFor(t, "step 10", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 10 })
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("fault injection seed %d", seed)
	killed := map[int]bool{}
	deadline := time.Now().Add(6 * time.Second)
	kills := 0
	for time.Now().Before(deadline) {
		h.Mu.Lock()
		var alive []int
		for i := range h.Pids {
			if !killed[i] {
				alive = append(alive, i)
			}
		}
		done := e2e.MaxStep(h.Lines) >= steps-50
		h.Mu.Unlock()
		if done {
			break
		}
		slices.Sort(alive)
		if len(alive) > 2 {
			victim := alive[rng.IntN(len(alive))]
			syscall.Kill(h.Pid(t, victim), syscall.SIGKILL)
			killed[victim] = true
			kills++
			h.Cmd.Process.Signal(syscall.SIGUSR1) // a replacement
		}
		// Wait a random while, but on the job's progress, not on the clock
		// alone: the next kill comes once training has moved on.
		h.Mu.Lock()
		s := e2e.MaxStep(h.Lines)
		h.Mu.Unlock()
		pause := time.Duration(100+rng.IntN(400)) * time.Millisecond
		h.WaitFor(t, "progress after a kill", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) > s })
		select {
		case <-time.After(pause):
		case err := <-h.Exited:
			t.Fatalf("job ended during fault injection: %v\n%s", err, h.Log.String())
		}
	}
	t.Logf("%d workers killed", kills)
	defer func() {
		if t.Failed() {
			log := h.LogText()
			t.Logf("the launcher log's last 8 KiB:\n%s", log[max(0, len(log)-8<<10):])
		}
	}()
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		h.Mu.Lock()
		defer h.Mu.Unlock()
		t.Fatalf("job did not finish (last step %d); launcher log:\n%s", e2e.MaxStep(h.Lines), h.Log.String())
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
}

// TestFashionMNISTUnderRun trains the real example elastically on part of the
// data and checks that the workers agree at every step and learn.
func TestFashionMNISTUnderRun(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	// --min-np 2: a first worker alone would finish the 188 steps in a second,
	// before a second worker that loads its data more slowly could join.
	h := e2e.StartRunJob(t, "--np", "2", "--min-np", "2", "--", e2e.FashionMNIST, "--epochs", "2", "--train-limit", "6000", "--json", "--log-every", "0")
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	checkFashionMNIST(t, h.Lines, 0.7)
}

// TestRunWakesAWorkerPausedAtTheEnd: the last world's rank 0 pauses itself
// (SIGSTOP) once it has reported the end of training, as a chaos trial's
// worker paused there by hand and never resumed (the runner stopped it at
// ExitLimit, 30 s on, and SIGINT, pending while it was paused, then SIGKILL
// ended it: counted stopped, and in that trial without its final line,
// which the example then wrote after its report). The runner wakes the
// job's running processes FinishGrace after the end: the worker exits by
// itself, finished.
func TestRunWakesAWorkerPausedAtTheEnd(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	h := e2e.StartRunJob(t, "--np", "3", "--", e2e.FashionMNIST, "--epochs", "1", "--train-limit", "3000", "--json", "--log-every", "0", "--pause-at-end")
	h.LogTailOnFailure(t, "gorovod run's output")
	h.WaitExit(t, 2*time.Minute)
	log := h.LogText()
	if !strings.Contains(log, "] final: test accuracy") {
		t.Error("the last world's rank 0 never wrote its final line")
	}
	if !strings.Contains(log, "gorovod run: 3 workers finished, 0 lost, 0 failed;") {
		t.Error("want the 3 workers counted finished (the paused one exiting by itself, not stopped)")
	}
}

// TestRunWritesTheResultWhenRank0DiesAtTheEnd: the last world's rank 0 is
// killed (SIGKILL, by itself: --die-at-end) as it is about to write the
// job's result, after the last step and its evaluation, as a chaos trial's
// rank 0 killed by hand there left the job without its final line. The
// others wait at the end (sync's TrainConfig.Final) for it; its death
// breaks their barrier, the world is formed again without it, and its new
// rank 0 evaluates the same parameters and writes the line, once.
func TestRunWritesTheResultWhenRank0DiesAtTheEnd(t *testing.T) {
	if !e2e.HaveFashionMNIST() {
		t.Skip("needs Debian's dataset-fashion-mnist (CI installs it)")
	}
	marker := filepath.Join(t.TempDir(), "died")
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--", e2e.FashionMNIST, "--epochs", "1", "--train-limit", "3000", "--json", "--log-every", "0", "--die-at-end", marker)
	h.LogTailOnFailure(t, "gorovod run's output")
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the job did not end")
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("no rank 0 died at the end: %v", err)
	}
	log := h.LogText()
	if n := strings.Count(log, "] final: test accuracy"); n != 1 {
		t.Errorf("%d final lines, want 1 (from the new rank 0)", n)
	}
	if !strings.Contains(log, "gorovod run: 2 workers finished, 1 lost, 0 failed;") {
		t.Error("want 2 workers finished and the one killed lost")
	}
}

// checkFashionMNIST: the workers of each world agree at every step, and the
// model learns.
func checkFashionMNIST(t *testing.T, lines []e2e.TrainerLine, minAccuracy float64) {
	t.Helper()
	if msg, ok := e2e.Disagreement(lines); !ok {
		t.Fatal(msg)
	}
	steps := map[int64]bool{}
	ranks := map[int]bool{}
	for _, l := range lines {
		if l.Params == "" || l.Size == 0 {
			continue // epoch and final records
		}
		steps[l.Step] = true
		ranks[l.Rank] = true
	}
	if len(steps) < 150 || len(ranks) < 2 {
		t.Fatalf("%d steps from ranks %v", len(steps), ranks)
	}
	var acc float64
	for _, l := range lines {
		acc = max(acc, l.Accuracy)
	}
	if acc < minAccuracy {
		t.Fatalf("test accuracy %.3f after 2 epochs", acc)
	}
	t.Logf("%d steps, test accuracy %.1f%%", len(steps), 100*acc)
}

// A collective of the final step can complete on some workers and fail on
// others: those that completed finish, and the others redo the step in a world
// of their own, below --min-np (sync's rescue). The launcher must let them
// finish rather than stop them as late joiners. Worker 2 trains one step
// more, as such a worker must; alone, its step takes 64 × 60 ms = 3.8 s,
// longer than the 3 s the launcher gives workers once training is over.
func TestRunLetsTheLastStepFinish(t *testing.T) {
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "3", "--", e2e.Synthetic, "--steps", "3", "--json",
		"--batch", "64", "--compute", "60ms", "--model-size", "1024", "--extra-step-worker", "2")
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("job did not finish; launcher log:\n%s", h.LogText())
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	for _, l := range h.Lines {
		if l.Step == 4 {
			if l.Worker != 2 || l.Size != 1 {
				t.Fatalf("step 4 ran on worker %d in a world of %d, want worker 2 alone", l.Worker, l.Size)
			}
			return
		}
	}
	t.Fatalf("worker 2 never finished its extra step; launcher log:\n%s", h.Log.String())
}

// TestRealDeathsLeaveOne: three workers, two of them killed at once (kill
// -9) with --min-np 1. Their deaths are known (the launcher sees the
// processes exit), not only suspected by gossip, so the quorum of the last
// world does not hold the survivor back: it trains on alone and finishes.
func TestRealDeathsLeaveOne(t *testing.T) {
	const samples = 1200
	h := e2e.StartRunJob(t, "--np", "3", "--min-np", "1", "--", e2e.Synthetic,
		"--steps", "400", "--json", "--log-samples", "--samples", fmt.Sprint(samples), "--batch", "24",
		"--model-size", "20000", "--compute", "2ms")
	h.WaitFor(t, "a 3-worker world at step 20", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 20 && e2e.LastSize(l) == 3 })
	h.Mu.Lock()
	s := e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	start := time.Now()
	one, two := h.Pid(t, 1), h.Pid(t, 2)
	syscall.Kill(one, syscall.SIGKILL)
	syscall.Kill(two, syscall.SIGKILL)
	h.WaitFor(t, "a 1-worker world after two kill -9", 60*time.Second, e2e.SizeAfter(s, 1))
	t.Logf("two of three killed: 1-worker steps after %v", time.Since(start))
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("job did not finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	e2e.CheckOneWorldPerStep(t, h.Lines, h.Log.String())
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, 400)
}
