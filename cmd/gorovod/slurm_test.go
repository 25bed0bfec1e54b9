package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/testing/testslurm"
)

// salloc runs `gorovod run --slurm args...` under salloc in an allocation of
// ntasks tasks of cluster c, as a user at a login node would, and follows it.
func salloc(t *testing.T, c *testslurm.Cluster, ntasks int, args ...string) *e2e.RunJobHarness {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a job through a real Slurm cluster; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	argv := append([]string{"--ntasks=" + fmt.Sprint(ntasks), "--job-name=gorovod-driver", e2e.Binary, "run", "--slurm"}, args...)
	return e2e.StartHarness(t, c.Command(ctx, "salloc", argv...))
}

// workerSteps lists the worker steps squeue shows, by launch index:
// "gorovod-worker-3" → "7.4".
func workerSteps(t *testing.T, c *testslurm.Cluster) map[int]string {
	t.Helper()
	out, err := c.Run(context.Background(), "squeue", "--steps", "--noheader", "--format=%i %j")
	if err != nil {
		t.Fatal(err)
	}
	steps := map[int]string{}
	for _, line := range strings.Split(out, "\n") {
		var id string
		var index int
		if _, err := fmt.Sscanf(line, "%s gorovod-worker-%d", &id, &index); err == nil {
			steps[index] = id
		}
	}
	return steps
}

// waitSteps waits until cond holds over the running worker steps.
func waitSteps(t *testing.T, c *testslurm.Cluster, what string, timeout time.Duration, cond func(map[int]string) bool) map[int]string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		steps := workerSteps(t, c)
		if cond(steps) {
			return steps
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: worker steps still %v after %v", what, steps, timeout)
		}
		time.Sleep(100 * time.Millisecond) // squeue has no way to wait on a change
	}
}

// TestSlurmElasticJob runs the synthetic trainer's known curve (see
// autoscale_test.go) through a real Slurm cluster: `gorovod run --slurm`
// under salloc starts its workers as srun steps of the allocation, the
// scaling-efficiency heuristic grows the job (new steps) and shrinks it
// (steps ended), at most the allocation's 6 tasks; mid-run one worker's step
// is sent SIGTERM through Slurm (it leaves within its notice) and another's
// is cancelled (SIGKILL at once). The job finishes with the workers agreeing
// on the parameters at every step and every sample of each data epoch
// trained on once; testslurm stops every daemon by pid and checks that
// nothing of the job is left.
func TestSlurmElasticJob(t *testing.T) {
	const steps, samples = 400, 4096
	const notice = 3 * time.Second
	c := testslurm.New(t, testslurm.DefaultConfig())
	args := []string{"--np", "1", "--json", "--heuristic", "scaling-efficiency",
		"--heuristic-opt", "threshold=0.05", "--heuristic-opt", "min_steps=10", "--heuristic-opt", "eval_every=5",
		"--leave-notice", notice.String(),
		"--", e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples)}
	h := salloc(t, c, 6, append(args, knownCurve...)...)
	h.LogTailOnFailure(t, "gorovod run's log")

	// The search grows from 1 by 4: five workers, five steps.
	h.WaitFor(t, "a world of 5", 2*time.Minute, func(l []e2e.TrainerLine) bool { return e2e.LastSize(l) >= 5 })
	running := waitSteps(t, c, "5 worker steps", 30*time.Second, func(s map[int]string) bool { return len(s) >= 5 })
	t.Logf("grown to 5 workers, as steps %v", running)

	// Slurm asks one worker to go (as a preemption with notice does): it
	// leaves the job gracefully, and its step ends, within its notice.
	var leaver int
	for i := range running {
		leaver = max(leaver, i)
	}
	t0 := time.Now()
	if _, err := c.Run(context.Background(), "scancel", "--signal=TERM", running[leaver]); err != nil {
		t.Fatal(err)
	}
	waitSteps(t, c, "the SIGTERMed step to end", notice+5*time.Second, func(s map[int]string) bool { return s[leaver] == "" })
	left := time.Since(t0)
	t.Logf("step %s (worker %d) ended %v after its SIGTERM (notice %v)", running[leaver], leaver, left.Round(time.Millisecond), notice)
	if left > notice+time.Second { // squeue's view lags the step's end a little
		t.Errorf("the worker's step ended %v after its SIGTERM; its notice is %v", left, notice)
	}

	// The heuristic shrinks the job through Slurm: its steps end.
	h.WaitFor(t, "a shrink carried out", 3*time.Minute, func([]e2e.TrainerLine) bool {
		return e2e.CarriedOut(h.EngineEventsLocked(t), heuristics.Shrink)
	})
	// Then a step is cancelled outright (scancel JOB.STEP: SIGKILL at once):
	// the job goes on without that worker. The newest step may be the
	// shrink's leaver, ending between squeue and scancel (Slurm: "Invalid
	// job id specified"): then it is chosen again among the steps left.
	for attempt := 1; ; attempt++ {
		running = workerSteps(t, c)
		victim := -1
		for i := range running {
			victim = max(victim, i)
		}
		if victim < 0 || len(running) < 2 {
			t.Logf("no second step to cancel (steps %v): the job had shrunk to one worker", running)
			break
		}
		h.Mu.Lock()
		s := e2e.MaxStep(h.Lines)
		h.Mu.Unlock()
		if _, err := c.Run(context.Background(), "scancel", running[victim]); err != nil {
			if !strings.Contains(err.Error(), "Invalid job id") || attempt == 3 {
				t.Fatal(err)
			}
			t.Logf("step %s (worker %d) ended before scancel reached it (%v); choosing again", running[victim], victim, err)
			continue
		}
		h.WaitFor(t, "training to go on after scancel", time.Minute, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) > s+5 })
		t.Logf("step %s (worker %d) cancelled at step %d; training went on", running[victim], victim, s)
		break
	}

	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("salloc gorovod run: %v", err)
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("the job did not finish")
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	evs := h.EngineEventsLocked(t)
	e2e.LogDecisions(t, evs)
	if !e2e.CarriedOut(evs, heuristics.Grow) || !e2e.CarriedOut(evs, heuristics.Shrink) {
		t.Errorf("the engine did not both grow and shrink the job through Slurm")
	}
	biggest := 0
	for _, l := range h.Lines {
		biggest = max(biggest, l.Size)
	}
	if biggest > 6 {
		t.Errorf("a world of %d workers in an allocation of 6 tasks", biggest)
	}
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
	if !strings.Contains(h.Log.String(), "Slurm job ") {
		t.Errorf("gorovod run did not say it runs in the allocation")
	}
	if left := workerSteps(t, c); len(left) > 0 {
		t.Errorf("worker steps still running after the job: %v", left)
	}
}

// Outside an allocation, --slurm says what is wrong.
func TestSlurmOutsideAllocation(t *testing.T) {
	cmd := exec.Command(e2e.Binary, "run", "--slurm", "--", "true")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SLURM_") })
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not inside a Slurm allocation") {
		t.Fatalf("gorovod run --slurm outside Slurm: %v: %s", err, out)
	}
}

// TestSlurmBatchScript submits deploy/slurm/gorovod.sbatch, the script
// docs/clusters.md gives, with sbatch: gorovod run runs in the batch script,
// its workers are steps of the batch job, and the job's output file holds
// their lines: the job trains to the end, consistently.
func TestSlurmBatchScript(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a job through a real Slurm cluster; skipped with -short")
	}
	const steps, samples = 60, 1200
	c := testslurm.New(t, testslurm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// A job bigger than its allocation is refused before it starts.
	if out, err := c.Run(ctx, "salloc", "--ntasks=2", e2e.Binary, "run", "--slurm", "--np", "3", "--", "true"); err == nil || !strings.Contains(out, "--np 3 is more than the 2 tasks") {
		t.Fatalf("--np 3 in 2 tasks: %v: %s", err, out)
	}
	script, err := filepath.Abs("../../deploy/slurm/gorovod.sbatch")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "job.out")
	cmd := c.Command(ctx, "sbatch", "--parsable", "--output="+out, "--time=10", script,
		e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--samples", fmt.Sprint(samples), "--batch", "20", "--compute", "1ms")
	// The batch script finds gorovod and the trainer on its PATH, as on a
	// cluster with a shared file system.
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(e2e.Binary)+":"+os.Getenv("PATH"))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch: %v: %s", err, b)
	}
	id := strings.TrimSpace(string(b))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		jobs, err := c.Jobs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(jobs, "\n"), id+" ") {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(out)
			t.Fatalf("batch job %s still %v; its output:\n%s", id, jobs, log)
		}
		time.Sleep(200 * time.Millisecond) // squeue has no way to wait on a change
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := &e2e.RunJobHarness{Pids: map[int]int{}, Notify: make(chan struct{}, 1)}
	h.Read(f)
	log := h.Log.String()
	if !strings.Contains(log, "Slurm job "+id+":") || !strings.Contains(log, "0 failed") {
		t.Fatalf("the batch job's output:\n%s", log)
	}
	e2e.CheckElasticInvariantsSteps(t, h.Lines, samples, steps)
	t.Logf("batch job %s: %d trainer lines; gorovod run said:\n%s", id, len(h.Lines), log)
}
