package testslurm

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestClusterRunsStepsAndCleansUp starts a cluster, runs a two-task step and
// a job that outlives the test's interest in it, and checks that Stop ends
// that job and leaves no process and no directory behind.
func TestClusterRunsStepsAndCleansUp(t *testing.T) {
	if why := Missing(); why != "" {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop(context.Background())
		}
	}()
	out, err := c.Run(ctx, "srun", "--ntasks=2", "--label", "printenv", "SLURM_STEP_ID")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(out, "\n"); len(lines) != 2 || !strings.HasPrefix(out, "0: 0") && !strings.HasPrefix(out, "1: 0") {
		t.Fatalf("srun --ntasks=2 printed %q", out)
	}
	id, err := c.Allocate(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	// A step that runs until it is killed.
	sleeper := c.Command(ctx, "srun", "--jobid="+id, "--ntasks=1", "sleep", "1000")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	sleeperDone := make(chan error, 1)
	go func() { sleeperDone <- sleeper.Wait() }()
	waitCtx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	// The step shows in squeue once slurmctld has it, which may be before
	// slurmd has started its slurmstepd: the cluster's processes are
	// looked at until both are there.
	for {
		steps, err := c.Run(waitCtx, "squeue", "--steps", "--noheader", "--format=%i")
		if err != nil {
			t.Fatal(err)
		}
		left := c.Leftovers()
		if strings.Contains(steps, id+".0") && len(left) >= 2 { // srun and slurmstepd at least
			break
		}
		select {
		case <-waitCtx.Done():
			t.Fatalf("the step never showed in squeue with its processes: squeue %q, processes %v", steps, left)
		case <-time.After(50 * time.Millisecond):
		}
	}
	dir := c.Dir
	stopped = true
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sleeperDone:
	case <-time.After(30 * time.Second):
		t.Fatal("srun still runs after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", dir, err)
	}
	if left := c.Leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}
