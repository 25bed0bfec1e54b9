package pool_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cluster/pool"
	"github.com/gorovod/gorovod/cluster/scheduler"
)

// synthetic is the examples/synthetic trainer, built once for the tests.
var synthetic string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sim-pool-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	synthetic = filepath.Join(dir, "synthetic")
	build := exec.Command("go", "build", "-o", synthetic, "../../examples/synthetic")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building examples/synthetic:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syntheticJob is a job of the synthetic trainer: steps global steps of a
// batch of 32 samples at 1 ms of compute each, which more workers split.
func syntheticJob(name string, steps int, submit time.Duration) pool.JobSpec {
	return pool.JobSpec{Name: name, Submit: submit, MaxWorkers: 3,
		Argv: []string{synthetic, "--steps", strconv.Itoa(steps), "--batch", "32", "--compute", "1ms", "--model-size", "16384"}}
}

// TestPoolSharesSlots runs three real jobs arriving one after another on a
// pool of four slots under each policy: every job finishes, the allocations
// change as jobs arrive, grow and end, and no round allocates more slots than
// the pool has.
func TestPoolSharesSlots(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy func() scheduler.Policy
	}{
		{"pollux", func() scheduler.Policy {
			return scheduler.NewPollux(scheduler.PolluxConfig{Population: 30, Generations: 30, RestartPenalty: time.Second})
		}},
		{"optimus", func() scheduler.Policy { return scheduler.NewOptimus() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var mu sync.Mutex
			var rounds []pool.Round
			cfg := pool.DefaultConfig()
			cfg.Slots, cfg.Interval, cfg.Policy = 4, 750*time.Millisecond, tc.policy()
			cfg.Jobs = []pool.JobSpec{
				syntheticJob("a", 600, 0),
				syntheticJob("b", 400, 2*time.Second),
				syntheticJob("c", 300, 4*time.Second),
			}
			cfg.Job.RemoveGrace = 5 * time.Second
			cfg.OnRound = func(r pool.Round) {
				mu.Lock()
				rounds = append(rounds, r)
				mu.Unlock()
			}
			res, err := pool.Run(ctx, cfg)
			if err != nil {
				t.Fatalf("Run: %v (result %+v)", err, res)
			}
			for _, j := range res.Jobs {
				t.Logf("%s: %s jct %.1fs resizes %d profiled %d", j.Name, j.State, j.JCT, j.Resizes, j.Profiled)
				if j.State != pool.Done {
					t.Errorf("job %s ended %s: %s", j.Name, j.State, j.Err)
				}
			}
			seen := map[string]map[int]bool{}
			for _, r := range rounds {
				line := fmt.Sprintf("round %d %.1fs:", r.Round, r.Elapsed)
				if r.Used > r.Slots {
					t.Errorf("round %d allocates %d of %d slots", r.Round, r.Used, r.Slots)
				}
				for _, j := range r.Jobs {
					line += fmt.Sprintf(" %s=%s/%d/%d", j.Name, j.State, j.Allocated, j.Workers)
					if j.State == pool.Running {
						if seen[j.Name] == nil {
							seen[j.Name] = map[int]bool{}
						}
						seen[j.Name][j.Allocated] = true
					}
				}
				t.Log(line)
			}
			changed := 0
			for _, sizes := range seen {
				if len(sizes) > 1 {
					changed++
				}
			}
			if changed == 0 {
				t.Errorf("no running job's allocation changed: %v", seen)
			}
			t.Logf("avg JCT %.1fs makespan %.1fs utilization %.2f, %d rounds", res.AvgJCT, res.Makespan, res.SlotUtilization, res.Rounds)
		})
	}
}

// running lists the processes running the test's synthetic binary (its path is
// unique to this test binary's temporary directory).
func running(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == synthetic {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestPoolCancel ends a pool while its job trains: Run stops the job's
// workers, waits for them and returns the context's error; a job whose
// command fails is reported failed without stopping the others.
func TestPoolCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := pool.DefaultConfig()
	cfg.Slots, cfg.Interval = 2, 500*time.Millisecond
	cfg.Jobs = []pool.JobSpec{syntheticJob("long", 1_000_000, 0), {Name: "broken", Argv: []string{"/bin/false"}}}
	cfg.OnRound = func(r pool.Round) {
		if r.Jobs[0].Workers > 0 && r.Jobs[1].State == pool.Failed {
			cancel()
		}
	}
	done := make(chan struct{})
	var res pool.Result
	var err error
	go func() {
		defer close(done)
		res, err = pool.Run(ctx, cfg)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60 s of its start")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if s := res.Jobs[0].State; s != pool.Failed {
		t.Errorf("the cancelled job ended %s", s)
	}
	if s := res.Jobs[1]; s.State != pool.Failed || s.Err == "" {
		t.Errorf("the broken job: %+v", s)
	}
	if ps := running(t); len(ps) > 0 {
		t.Errorf("synthetic workers still running after Run returned: pids %v", ps)
	}
}
