package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

// TestStoppedWorkerAfterTakeover: once `gorovod run` is gone (kill -9) and a
// worker proposes the worlds in its place, a worker frozen with SIGSTOP
// (alive to the kernel, answering nothing) is found, left out of the next
// world and named, with why, in the log of the worker that proposes; the
// others train on without it. The worker that took over proposes with the
// job's probe timeout (`--probe-timeout`, which every worker gets as
// GOROVOD_PROBE_TIMEOUT, the hand-started one from the job file): its
// takeover's log line says so.
//
// With gossip's defaults, gossip declares the frozen worker dead within
// about a second (why: failed). With gossip slowed (the trainer's
// --gossip-suspicion-mult: 20 s), the others' step ends at the collective's
// I/O timeout, they blame the frozen worker, and the proposer probes it: it
// must be removed as blamed and unanswered, about the probe timeout after
// the first blame (a proposer with the default 500 ms would remove it 2.5 s
// sooner). The frozen worker is one `gorovod run` started, or one started by
// hand with the job file (`gorovod attach`).
func TestStoppedWorkerAfterTakeover(t *testing.T) {
	// Longer than the test: it ends by killing the workers.
	const steps = 1000000
	// Bounds the frozen worker's removal: gossip declares it dead within
	// about a second, the collective's I/O timeout (5 s) or the probe
	// (probeTimeout) end the step stuck on it; the rest is room for a
	// loaded machine.
	const removalLimit = 30 * time.Second
	const probeTimeout = 3 * time.Second
	for _, tc := range []struct {
		name   string
		byHand bool
		// suspicion is the trainer's --gossip-suspicion-mult (0: the
		// default); with it, the probe must remove the frozen worker.
		suspicion int
	}{
		{"launched worker, gossip", false, 0},
		{"launched worker, probe", false, 100},
		{"hand-started worker, probe", true, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, tmp := t.TempDir(), t.TempDir()
			launched := 3
			if tc.byHand {
				launched = 2
			}
			trainer := []string{e2e.Synthetic, "--steps", fmt.Sprint(steps), "--json", "--compute", "200us", "--model-size", "4096", "-v",
				"--gossip-suspicion-mult", fmt.Sprint(tc.suspicion)}
			h := startRunIn(t, tmp, append([]string{"--np", fmt.Sprint(launched), "--min-np", "2", "--output-dir", dir,
				"--probe-timeout", fmt.Sprint(probeTimeout.Seconds()), "--"}, trainer...)...)
			h.LogTailOnFailure(t, "gorovod run")
			// Each worker's output: stdout and stderr files.
			type output struct{ stdout, stderr string }
			var outs []output
			for i := range launched {
				outs = append(outs, output{filepath.Join(dir, fmt.Sprintf("worker-%d.stdout", i)), filepath.Join(dir, fmt.Sprintf("worker-%d.stderr", i))})
			}
			var pids []int
			if tc.byHand {
				file := h.WaitLog(t, "the job file", 60*time.Second, jobFileHint)[1]
				out := output{filepath.Join(tmp, "hand.stdout"), filepath.Join(tmp, "hand.stderr")}
				stdout, err := os.Create(out.stdout)
				if err != nil {
					t.Fatal(err)
				}
				stderr, err := os.Create(out.stderr)
				if err != nil {
					t.Fatal(err)
				}
				hand := exec.Command(e2e.Binary, append([]string{"attach", file, "--"}, trainer...)...)
				hand.Stdout, hand.Stderr = stdout, stderr
				err = hand.Start()
				stdout.Close()
				stderr.Close()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = hand.Process.Kill(); _ = hand.Wait() })
				outs = append(outs, out)
				pids = append(pids, hand.Process.Pid) // its place in outs, after the launched ones
			}
			h.WaitFor(t, "step 30 in a world of 3", 2*time.Minute, func(lines []e2e.TrainerLine) bool {
				return slices.ContainsFunc(lines, func(l e2e.TrainerLine) bool { return l.Size == 3 && l.Step >= 30 })
			})
			launchedPids := make([]int, launched)
			for i := range launched {
				launchedPids[i] = h.Pid(t, i)
			}
			pids = append(launchedPids, pids...)
			if err := syscall.Kill(h.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			<-h.Exited
			t.Cleanup(func() {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL) // stopped or not: this test started them
				}
				if t.Failed() {
					for i, o := range outs {
						b, _ := os.ReadFile(o.stderr)
						t.Logf("worker %d's stderr (last 6 KiB):\n%s", i, b[max(0, len(b)-6<<10):])
					}
				}
			})

			// The worker that takes over says so, with the job's probe timeout.
			proposer := -1
			var takeover string
			pollFiles(t, "a worker to take over proposing", 2*time.Minute, func() bool {
				for i, o := range outs {
					if l := lineWith(o.stderr, `msg="no driver: this worker, the oldest ready one, takes over proposing epochs"`); l != "" {
						proposer, takeover = i, l
						return true
					}
				}
				return false
			})
			if want := "probe_timeout=" + probeTimeout.String(); !strings.Contains(takeover, want) {
				t.Fatalf("worker %d took over without the job's probe timeout (%s): %s", proposer, want, takeover)
			}
			victim := len(outs) - 1 // the hand-started worker, or the youngest launched one
			if victim == proposer {
				victim--
			}
			var survivors []int
			for i := range outs {
				if i != victim {
					survivors = append(survivors, i)
				}
			}
			name := lastStepOf(t, outs[victim].stdout).Worker
			if name == "" {
				t.Fatalf("worker %d printed no step with its name", victim)
			}
			before := int64(0)
			for _, i := range survivors {
				before = max(before, lastStepOf(t, outs[i].stdout).Step)
			}
			if err := syscall.Kill(pids[victim], syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			t.Logf("worker %d (%s) took over; worker %d (%s, pid %d) stopped at step %d", proposer, takeover, victim, name, pids[victim], before)

			// Out, named, within the limit.
			removed := regexp.MustCompile(`msg="removed from the next world" worker=` + regexp.QuoteMeta(name) + ` why=("[^"]*"|\S+)`)
			var why string
			pollFiles(t, fmt.Sprintf("the proposer to remove the stopped worker %s", name), removalLimit, func() bool {
				if m := removed.FindStringSubmatch(lineMatching(outs[proposer].stderr, removed)); m != nil {
					why = strings.Trim(m[1], `"`)
					return true
				}
				return false
			})
			took := time.Since(stopped)
			t.Logf("removed %v after SIGSTOP, why: %s", took, why)
			switch {
			case tc.suspicion == 0 && why != "failed" && why != "blamed and unanswered":
				t.Fatalf("the stopped worker was removed as %q, want failed (gossip) or blamed and unanswered (the probe)", why)
			case tc.suspicion > 0 && why != "blamed and unanswered":
				t.Fatalf("the stopped worker was removed as %q, want blamed and unanswered (gossip was slowed: the probe decides)", why)
			case tc.suspicion > 0:
				blamed := logTime(t, lineMatching(outs[proposer].stderr, regexp.MustCompile(`msg="collective failure reported" .*blamed=`+regexp.QuoteMeta(name)+` `)))
				out := logTime(t, lineMatching(outs[proposer].stderr, removed))
				// The log's times are truncated to milliseconds, and the
				// blame's line is written after the probe was sent: a
				// second of slack, far above the default's 500 ms.
				if out.Sub(blamed) < probeTimeout-time.Second {
					t.Fatalf("the stopped worker was removed %v after it was first blamed, before the job's probe timeout of %v", out.Sub(blamed), probeTimeout)
				}
				t.Logf("removed %v after it was first blamed", out.Sub(blamed))
			}

			// The others train on, in a world without it.
			pollFiles(t, "20 steps of the survivors in a world of 2", 2*time.Minute, func() bool {
				for _, i := range survivors {
					if l := lastStepOf(t, outs[i].stdout); l.Size != 2 || l.Step < before+20 {
						return false
					}
				}
				return true
			})
		})
	}
}

// logTime is the time of a log line of slog's text handler ("time=...").
func logTime(t *testing.T, line string) time.Time {
	t.Helper()
	v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.Fatalf("no time in the log line %q: %v", line, err)
	}
	return at
}

// pollFiles waits up to limit for cond, which reads files that processes
// write (nothing to wait on but the files): every 50 ms.
func pollFiles(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		<-tick.C
	}
}

// lineWith returns the first line of file path that contains s ("" if none).
func lineWith(path, s string) string {
	return lineMatching(path, regexp.MustCompile(regexp.QuoteMeta(s)))
}

// lineMatching returns the first line of file path re matches ("" if none).
func lineMatching(path string, re *regexp.Regexp) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		if re.Match(sc.Bytes()) {
			return sc.Text()
		}
	}
	return ""
}

// namedStep is a synthetic trainer's step line with its member name.
type namedStep struct {
	Step   int64  `json:"step"`
	Size   int    `json:"size"`
	Worker string `json:"worker"`
}

// lastStepOf returns the last step line in the synthetic trainer's stdout
// file path (zero if none).
func lastStepOf(t *testing.T, path string) namedStep {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return namedStep{}
	}
	defer f.Close()
	var last namedStep
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		var l namedStep
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Step > 0 {
			last = l
		}
	}
	return last
}
