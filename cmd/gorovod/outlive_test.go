package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// TestJobOutlivesLauncher kills `gorovod run` (kill -9) in the middle of a
// 3-worker job: the workers, which write their output into the job's
// directory rather than to pipes to the launcher, must train on in their
// world (one of them takes over proposing worlds), finish every step with the
// same parameters in each world, and exit; `gorovod follow` started after the
// kill shows their lines and says when the job is over. With "and a worker",
// a worker is killed as well once the launcher is gone: the others must leave
// it out and finish without any driver.
func TestJobOutlivesLauncher(t *testing.T) {
	const steps = 600
	for _, tc := range []struct {
		name       string
		killWorker bool
	}{
		{"launcher", false},
		{"launcher and a worker", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			h := e2e.StartRunJob(t, "--np", "3", "--min-np", "2", "--output-dir", dir, "--",
				e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--compute", "200us", "--model-size", "4096")
			h.WaitAllAtStep(t, 30, 3)
			pids := []int{h.Pid(t, 0), h.Pid(t, 1), h.Pid(t, 2)}
			if err := syscall.Kill(h.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-h.Exited
			h.Mu.Lock()
			killedAt := e2e.MaxStep(h.Lines)
			h.Mu.Unlock()
			if killedAt >= steps {
				t.Fatalf("the job was over (step %d) before the launcher was killed: make it longer", killedAt)
			}
			t.Logf("launcher killed at step %d of %d", killedAt, steps)

			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			follow := exec.CommandContext(ctx, e2e.Binary, "follow", "-n", "0", dir)
			var followOut, followErr bytes.Buffer
			follow.Stdout, follow.Stderr = &followOut, &followErr
			if err := follow.Start(); err != nil {
				t.Fatal(err)
			}
			followDone := make(chan error, 1)
			go func() { followDone <- follow.Wait() }()

			survivors := pids
			if tc.killWorker {
				waitOutput(t, dir, 3, "20 steps after the launcher died", func(ws map[int][]e2e.TrainerLine) bool {
					return e2e.MaxStep(ws[2]) >= killedAt+20
				})
				if err := syscall.Kill(pids[2], syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				survivors = pids[:2]
			}
			ws := waitOutput(t, dir, 3, fmt.Sprintf("step %d on every surviving worker", steps), func(ws map[int][]e2e.TrainerLine) bool {
				for i := range survivors {
					if e2e.MaxStep(ws[i]) < steps {
						return false
					}
				}
				return true
			})
			if !waitAllGone(pids, time.Minute) {
				t.Fatalf("workers still running a minute after the last step: %v", pids)
			}
			// The workers agree on the parameters at every step they
			// committed, before the kill and after it.
			checkEveryStepAgreed(t, ws, steps)
			if tc.killWorker {
				if last := ws[0][len(ws[0])-1]; last.Size != 2 {
					t.Errorf("worker 0's last step was in a world of %d, want 2 (worker 2 left out)", last.Size)
				}
			}
			select {
			case err := <-followDone:
				if err != nil {
					t.Fatalf("gorovod follow: %v\n%s", err, followErr.String())
				}
			case <-time.After(time.Minute):
				t.Fatalf("gorovod follow still running a minute after the workers exited:\n%s", followErr.String())
			}
			for i := range survivors {
				if want := fmt.Sprintf(`[%d] {"step":%d,`, i, steps); !strings.Contains(followOut.String(), want) {
					t.Errorf("gorovod follow did not show worker %d's last step (%s...)", i, want)
				}
			}
			if !strings.Contains(followErr.String(), "the job is over: every worker has exited") {
				t.Errorf("gorovod follow did not say the job is over:\n%s", followErr.String())
			}
		})
	}
}

// checkEveryStepAgreed fails t unless every step from 1 to steps was
// committed by some worker of ws (their lines by worker) and the workers that
// committed a step in one world hold the same parameters after it. A step
// can be committed in two worlds: a worker killed in the middle of a step's
// allreduce may have received all of it and committed, where the others had
// not; they redo the step in the next world, without its gradient.
func checkEveryStepAgreed(t *testing.T, ws map[int][]e2e.TrainerLine, steps int64) {
	t.Helper()
	type key struct {
		step  int64
		world uint64
	}
	type commit struct {
		worker int
		params string
	}
	commits := map[key]commit{}
	committed := map[int64][]uint64{} // the worlds that committed each step
	for i, lines := range ws {
		for _, l := range lines {
			k := key{l.Step, l.WorldEpoch}
			c, ok := commits[k]
			if !ok {
				commits[k] = commit{i, l.Params}
				committed[l.Step] = append(committed[l.Step], l.WorldEpoch)
			} else if c.params != l.Params {
				t.Fatalf("step %d, world epoch %d: worker %d has parameters %.12s, worker %d %.12s",
					l.Step, l.WorldEpoch, i, l.Params, c.worker, c.params)
			}
		}
	}
	for s := int64(1); s <= steps; s++ {
		switch worlds := committed[s]; {
		case len(worlds) == 0:
			t.Fatalf("no worker committed step %d", s)
		case len(worlds) > 1:
			t.Logf("step %d was committed in the worlds of epochs %v", s, worlds)
		}
	}
}

// waitOutput waits until cond holds over the synthetic trainer's step lines
// in the job directory's output files of workers 0..n-1, and returns them.
func waitOutput(t *testing.T, dir string, n int, what string, cond func(map[int][]e2e.TrainerLine) bool) map[int][]e2e.TrainerLine {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond) // files a process writes: no event to wait on
	defer tick.Stop()
	for {
		ws := map[int][]e2e.TrainerLine{}
		for i := range n {
			ws[i] = readStepLines(t, filepath.Join(dir, fmt.Sprintf("worker-%d.stdout", i)))
		}
		if cond(ws) {
			return ws
		}
		if time.Now().After(deadline) {
			for i := range n {
				b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("worker-%d.stderr", i)))
				t.Logf("worker %d: last step %d; stderr:\n%s", i, e2e.MaxStep(ws[i]), b)
			}
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func readStepLines(t *testing.T, path string) []e2e.TrainerLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []e2e.TrainerLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		var l e2e.TrainerLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Step > 0 {
			lines = append(lines, l)
		}
	}
	return lines
}

// waitAllGone waits up to limit for every pid to exit; the ones still
// running then are killed (this test started them).
func waitAllGone(pids []int, limit time.Duration) bool {
	e2e.WaitGone(pids, limit)
	ok := true
	for _, pid := range pids {
		if !e2e.ProcessGone(pid) {
			ok = false
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return ok
}
