package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/testing/testhosts"
	"github.com/gorovod/gorovod/job"
)

// TestRunAttach: a 3-worker job loses a worker (kill -9), which `gorovod
// run` replaces (the job's epochs are then past 1, as a fresh driver's would
// not be); then `gorovod run` itself is killed (kill -9), and `gorovod run
// --attach DIR` takes the job back: the workers train on without a world
// change, the new driver adopts them, replaces one killed afterwards (kill
// -9) with a worker of its own, and ends the job with exit status 0 once
// training is over — every step committed, with the same parameters on
// every worker. Its record says what it knows: the adopted workers that
// reported the end of training finished, the one killed under the first
// runner lost (as that runner recorded), the one killed after the takeover
// unknown (its exit status went to the dead runner's parent, not to this
// one).
func TestRunAttach(t *testing.T) {
	const steps = 4000
	dir := t.TempDir()
	h := e2e.StartRunJob(t, "--np", "3", "--output-dir", dir, "--",
		e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--compute", "200us", "--model-size", "4096")
	h.WaitAllAtStep(t, 30, 3)
	if err := syscall.Kill(h.Pid(t, 2), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.WaitFor(t, "the replacement, worker 3, training in a world of 3", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
		for _, l := range lines {
			if l.Worker == 3 && l.Size == 3 && l.Step >= 10 {
				return true
			}
		}
		return false
	})
	pids := []int{h.Pid(t, 0), h.Pid(t, 1), h.Pid(t, 3)}
	if err := syscall.Kill(h.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-h.Exited
	h.Mu.Lock()
	killedAt := e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	t.Logf("launcher killed at step %d of %d", killedAt, steps)
	// Training goes on without a driver.
	waitOutput(t, dir, 4, "20 steps after the launcher died", func(ws map[int][]e2e.TrainerLine) bool {
		return e2e.MaxStep(ws[0]) >= killedAt+20
	})

	// Relative, as a user in another directory would type it.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, dir)
	if err != nil {
		t.Fatal(err)
	}
	a := e2e.StartRunJob(t, "--attach", rel)
	a.WaitFor(t, "the adopted workers' lines through the new runner", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
		seen := map[int]bool{}
		for _, l := range lines {
			seen[l.Worker] = true
		}
		return len(seen) == 3
	})
	for i, worker := range []int{0, 1, 3} {
		if got := a.Pid(t, worker); got != pids[i] {
			t.Fatalf("the new runner adopted pid %d as worker %d, want %d", got, worker, pids[i])
		}
	}
	if !strings.Contains(a.LogText(), "took back job") {
		t.Fatalf("the new runner did not say it took the job back:\n%s", a.LogText())
	}
	a.Mu.Lock()
	firstSeen := e2e.MaxStep(a.Lines)
	a.Mu.Unlock()
	// The new driver learns the world and the workers see it (it proposes
	// nothing): 200 steps are well over the second that takes.
	a.WaitFor(t, "200 steps under the new runner", 2*time.Minute, func(lines []e2e.TrainerLine) bool { return e2e.MaxStep(lines) >= firstSeen+200 })
	a.Mu.Lock()
	attachedAt := e2e.MaxStep(a.Lines)
	a.Mu.Unlock()
	if attachedAt >= steps-200 {
		t.Fatalf("the job was nearly over (step %d) when the new runner took it: make it longer", attachedAt)
	}
	// Taking the job back needs no world change: the workers train on in
	// the world they had when the launcher died.
	h.Mu.Lock()
	before := h.Lines[len(h.Lines)-1].WorldEpoch
	h.Mu.Unlock()
	a.Mu.Lock()
	after := a.Lines[len(a.Lines)-1].WorldEpoch
	a.Mu.Unlock()
	t.Logf("world epoch %d when the launcher died, %d at step %d under the new runner", before, after, attachedAt)
	if after != before {
		t.Errorf("the world changed from epoch %d to %d while the job was taken back, with the same workers", before, after)
	}
	// The floor (--np 3) replaces it: worker 4, started by the new runner,
	// trains in a world of 3.
	log, ws := replaceAndFinish(t, a, pids[2], 4, dir, 5, steps, 0, 1)
	checkEveryStepAgreed(t, ws, steps)
	t.Logf("the new runner's log:\n%s", log)
	for _, want := range []string{"3 workers finished, 1 lost, 0 failed, 1 ended unknown", "worker 3 (pid "} {
		if !strings.Contains(log, want) {
			t.Errorf("the new runner's log lacks %q:\n%s", want, log)
		}
	}
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Ended || rec.Verdict != "ok" || rec.Adopted != 1 || rec.RunnerPID != a.Cmd.Process.Pid {
		t.Errorf("record: ended %v verdict %q adopted %d runner %d, want ended, ok, adopted once by pid %d",
			rec.Ended, rec.Verdict, rec.Adopted, rec.RunnerPID, a.Cmd.Process.Pid)
	}
	states := map[int]string{}
	for _, w := range rec.Workers {
		states[w.Index] = w.State
	}
	if want := map[int]string{0: "finished", 1: "finished", 2: "lost", 3: "unknown", 4: "finished"}; fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("recorded ends %v, want %v", states, want)
	}
	if !waitAllGone(pids, time.Minute) {
		t.Fatalf("adopted workers still running a minute after the job ended")
	}
}

// TestRunAttachStopReasons: `gorovod run --attach DIR` takes back a job
// whose record gives workers the dead runner stopped, each with why (one
// removed as stuck, one whose host left the job), and its last line counts
// them by those reasons, as the runner that stopped them did — not "for a
// reason the job's record does not give". The job's directory is a real
// one (a 1-worker job of 20 steps ran there); its record is made into that
// of a runner that died: no ended line, the two stopped workers, and a
// worker still running (a sleeper with the job's environment), which the
// new runner adopts and stops when it is interrupted (SIGINT).
func TestRunAttachStopReasons(t *testing.T) {
	dir := t.TempDir()
	h := e2e.StartRunJob(t, "--np", "1", "--output-dir", dir, "--", e2e.Synthetic, "--steps", "20", "--json")
	h.Wait(t)
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "600")
	sleeper.Env = []string{envconfig.EnvJobID + "=" + rec.JobID, envconfig.EnvLaunchIndex + "=7"}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	path := filepath.Join(dir, "record.tsv")
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(string(text), "\n") {
		if !strings.HasPrefix(l, "ended\t") {
			b.WriteString(l)
		}
	}
	d := dead.Process.Pid
	fmt.Fprintf(&b, "started\t5\t%d\t\nexited\t5\tstopped\tsignal: killed\tstuck\n", d)
	fmt.Fprintf(&b, "started\t6\t%d\t\nexited\t6\tstopped\tsignal: interrupt\thost-dropped\n", d)
	fmt.Fprintf(&b, "started\t7\t%d\t\n", sleeper.Process.Pid)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	a := e2e.StartRunJob(t, "--attach", dir)
	a.WaitLog(t, "the job taken back", time.Minute, regexp.MustCompile(`took back job`))
	if err := syscall.Kill(a.Cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Exited:
	case <-time.After(time.Minute):
		a.TimedOut(t, "the attached runner to end after SIGINT")
	}
	log := a.LogText()
	for _, want := range []string{"1 stopped (removed as stuck)", "1 stopped (host left the job)"} {
		if !strings.Contains(log, want) {
			t.Errorf("the new runner's log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "record does not give") {
		t.Errorf("the new runner counts workers stopped for a reason the record does not give:\n%s", log)
	}
	if rec, err = job.ReadJobRecord(dir); err != nil {
		t.Fatal(err)
	}
	why := map[int]job.StopReason{}
	for _, w := range rec.Workers {
		why[w.Index] = w.StopReason
	}
	if why[5] != job.StopStuck || why[6] != job.StopHostDropped {
		t.Errorf("the record after the takeover gives worker 5 %v and worker 6 %v, want stuck and host-dropped", why[5], why[6])
	}
}

// replaceAndFinish kills the adopted worker pid (kill -9), waits for the
// attached runner a to have its replacement (launch index replacement)
// training in a world of 3, then for a to end with status 0 and for the
// survivors and the replacement to reach step steps in their output files
// (outputs of them in dir). It returns a's log and the workers' lines.
func replaceAndFinish(t *testing.T, a *e2e.RunJobHarness, pid, replacement int, dir string, outputs int, steps int64, survivors ...int) (string, map[int][]e2e.TrainerLine) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.WaitFor(t, "a replacement training in a world of 3", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
		for _, l := range lines {
			if l.Worker == replacement && l.Size == 3 {
				return true
			}
		}
		return false
	})
	var err error
	select {
	case err = <-a.Exited:
	case <-time.After(3 * time.Minute):
		a.TimedOut(t, "the attached runner to end")
	}
	log := a.LogText()
	if err != nil {
		t.Fatalf("gorovod run --attach: %v; log:\n%s", err, log)
	}
	ws := waitOutput(t, dir, outputs, fmt.Sprintf("step %d on every surviving worker", steps), func(ws map[int][]e2e.TrainerLine) bool {
		for _, w := range append(survivors, replacement) {
			if e2e.MaxStep(ws[w]) < steps {
				return false
			}
		}
		return true
	})
	return log, ws
}

// jobSeed is the job's seed in its directory's job.env (GOROVOD_SEEDS):
// the gossip address of the driver that took it last.
func jobSeed(t *testing.T, dir string) string {
	t.Helper()
	env, err := job.ReadJobFile(filepath.Join(dir, "job.env"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, envconfig.EnvSeeds+"="); ok {
			return v
		}
	}
	t.Fatalf("job.env in %s has no %s", dir, envconfig.EnvSeeds)
	return ""
}

// TestRunAttachElsewhere: `gorovod run` is killed (kill -9), and another
// process takes its gossip port before `gorovod run --attach DIR` runs:
// the new driver cannot listen at the workers' seed, so it listens at
// another port and contacts the workers at the gossip addresses the record
// holds. It adopts the three workers with no world change, makes itself the
// job's seed (job.env), so that the replacement it starts for a worker
// killed afterwards (kill -9) joins it, and ends the job with status 0,
// every step committed with the same parameters on every worker.
func TestRunAttachElsewhere(t *testing.T) {
	const steps = 4000
	dir := t.TempDir()
	h := e2e.StartRunJob(t, "--np", "3", "--output-dir", dir, "--",
		e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--compute", "200us", "--model-size", "4096")
	h.WaitAllAtStep(t, 30, 3)
	pids := []int{h.Pid(t, 0), h.Pid(t, 1), h.Pid(t, 2)}
	oldSeed := jobSeed(t, dir)
	if err := syscall.Kill(h.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-h.Exited
	h.Mu.Lock()
	killedAt := e2e.MaxStep(h.Lines)
	before := h.Lines[len(h.Lines)-1].WorldEpoch
	h.Mu.Unlock()
	// Another process takes the dead driver's port.
	taken, err := net.Listen("tcp", oldSeed)
	if err != nil {
		t.Fatalf("taking the dead driver's port %s: %v", oldSeed, err)
	}
	defer taken.Close()
	waitOutput(t, dir, 3, "20 steps after the launcher died", func(ws map[int][]e2e.TrainerLine) bool {
		return e2e.MaxStep(ws[0]) >= killedAt+20
	})

	a := e2e.StartRunJob(t, "--attach", dir)
	a.WaitFor(t, "the adopted workers' lines through the new runner", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
		seen := map[int]bool{}
		for _, l := range lines {
			seen[l.Worker] = true
		}
		return len(seen) == 3
	})
	for i, pid := range pids {
		if got := a.Pid(t, i); got != pid {
			t.Fatalf("the new runner adopted pid %d as worker %d, want %d", got, i, pid)
		}
	}
	if !strings.Contains(a.LogText(), "cannot be bound") {
		t.Fatalf("the new runner did not say that it could not bind the workers' seed %s:\n%s", oldSeed, a.LogText())
	}
	a.Mu.Lock()
	firstSeen := e2e.MaxStep(a.Lines)
	a.Mu.Unlock()
	a.WaitFor(t, "200 steps under the new runner", 2*time.Minute, func(lines []e2e.TrainerLine) bool { return e2e.MaxStep(lines) >= firstSeen+200 })
	a.Mu.Lock()
	attachedAt, after := e2e.MaxStep(a.Lines), a.Lines[len(a.Lines)-1].WorldEpoch
	a.Mu.Unlock()
	if attachedAt >= steps-200 {
		t.Fatalf("the job was nearly over (step %d) when the new runner took it: make it longer", attachedAt)
	}
	t.Logf("world epoch %d when the launcher died, %d at step %d under the new runner", before, after, attachedAt)
	if after != before {
		t.Errorf("the world changed from epoch %d to %d while the job was taken back, with the same workers", before, after)
	}
	if seed := jobSeed(t, dir); seed == oldSeed {
		t.Errorf("job.env still names the dead driver's address %s as the job's seed", seed)
	}
	// The replacement joins through the new seed.
	log, ws := replaceAndFinish(t, a, pids[2], 3, dir, 4, steps, 0, 1)
	t.Logf("the new runner's log:\n%s", log)
	checkEveryStepAgreed(t, ws, steps)
	if !waitAllGone(pids, time.Minute) {
		t.Fatalf("adopted workers still running a minute after the job ended")
	}
}

// TestRunAttachAcrossHosts: the job's workers run on another host, started
// over ssh with their output in files there (the job directory's path on
// that host). `gorovod run` is killed (kill -9): the workers train on;
// `gorovod run --attach DIR` takes the job back and its workers over ssh
// (the shim on their host checks each pid), a worker killed afterwards is
// replaced over ssh, and the job ends with status 0, every step committed
// with the same parameters everywhere.
func TestRunAttachAcrossHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts hosts and real worker processes; skipped with -short")
	}
	const steps = 4000
	n, hs := testhosts.NewHosts(t, testhosts.Config{Prefix: "mhatt", SSHPort: 2222}, 2)
	dir := t.TempDir()
	h := e2e.HostJob(t, n, hs[0], []string{"--np", "3", "--output-dir", dir, "-H", hs[1].Name + ":4"},
		"--steps", fmt.Sprint(steps), "--json", "--compute", "200us", "--model-size", "4096")
	h.WaitAllAtStep(t, 30, 3)
	if err := syscall.Kill(h.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-h.Exited
	h.Mu.Lock()
	killedAt := e2e.MaxStep(h.Lines)
	h.Mu.Unlock()
	t.Logf("launcher killed at step %d of %d", killedAt, steps)
	waitOutput(t, dir, 3, "20 steps after the launcher died", func(ws map[int][]e2e.TrainerLine) bool {
		return e2e.MaxStep(ws[0]) >= killedAt+20 && e2e.MaxStep(ws[1]) >= killedAt+20 && e2e.MaxStep(ws[2]) >= killedAt+20
	})
	rec, err := job.ReadJobRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, w := range rec.Workers {
		if w.Host != hs[1].Name || w.PID == 0 {
			t.Fatalf("worker %d: recorded on %q with pid %d, want %s and its pid there", w.Index, w.Host, w.PID, hs[1].Name)
		}
		pids = append(pids, w.PID)
		t.Cleanup(func() { _ = syscall.Kill(w.PID, syscall.SIGKILL) }) // started by this test, over ssh
	}

	prefix, err := hs[0].Exec()
	if err != nil {
		t.Fatal(err)
	}
	a := e2e.StartRunJobArgv(t, append(prefix, e2e.Binary, "run", "--attach", dir))
	a.WaitFor(t, "the adopted workers' lines through the new runner", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
		seen := map[int]bool{}
		for _, l := range lines {
			seen[l.Worker] = true
		}
		return len(seen) == 3
	})
	log, ws := replaceAndFinish(t, a, pids[2], 3, dir, 4, steps, 0, 1)
	t.Logf("the new runner's log:\n%s", log)
	checkEveryStepAgreed(t, ws, steps)
	if !strings.Contains(log, "3 workers finished, 0 lost, 0 failed, 1 ended unknown") {
		t.Errorf("the new runner's count of the workers is not 3 finished and 1 unknown")
	}
	if !waitAllGone(pids, time.Minute) {
		t.Fatalf("adopted workers still running a minute after the job ended")
	}
}
