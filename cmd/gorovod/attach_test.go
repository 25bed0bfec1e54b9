package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

var jobFileHint = regexp.MustCompile(`start one by hand: gorovod attach (\S+) -- `)

// startRunIn runs `gorovod run args...` with TMPDIR=tmp, where it writes
// its job file (and sweeps stale ones).
func startRunIn(t *testing.T, tmp string, args ...string) *e2e.RunJobHarness {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real worker processes; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, e2e.Binary, append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	e2e.DumpOnCancel(cmd)
	return e2e.StartHarness(t, cmd)
}

// jobSecret is the GOROVOD_SECRET value a job file holds.
func jobSecret(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^GOROVOD_SECRET=([0-9a-f]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no secret in the job file:\n%s", b)
	}
	return string(m[1])
}

// commandLinesWith returns the processes whose command line contains s.
func commandLinesWith(t *testing.T, s string) []string {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range cmdlines {
		b, err := os.ReadFile(p) // a process gone meanwhile: skipped
		if err == nil && bytes.Contains(b, []byte(s)) {
			found = append(found, fmt.Sprintf("%s: %q", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return found
}

// TestAttachedWorkerJoins: a worker started with `gorovod attach JOBFILE --
// TRAINER` joins the job and trains to its end, keeps its pid (attach execs
// it), and no process's command line holds the job secret, while the
// attached worker runs; the job file is gone once the job ends.
func TestAttachedWorkerJoins(t *testing.T) {
	tmp := t.TempDir()
	h := startRunIn(t, tmp, "--np", "2", "--", e2e.Synthetic, "--steps", "300", "--compute", "2ms", "--model-size", "20000", "--json")
	file := h.WaitLog(t, "the job file", 60*time.Second, jobFileHint)[1]
	secret := jobSecret(t, file)
	h.WaitFor(t, "step 10", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hand := exec.CommandContext(ctx, e2e.Binary, "attach", file, "--", e2e.Synthetic, "--steps", "300", "--compute", "2ms", "--model-size", "20000")
	var handOut bytes.Buffer
	hand.Stdout, hand.Stderr = &handOut, &handOut
	if err := hand.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hand.Process.Kill(); hand.Wait() })
	h.WaitLog(t, "the attached worker's arrival", 60*time.Second, regexp.MustCompile(`gorovod run: worker \S+ joined \(started by hand\): world \d+ has 3 workers`))
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", hand.Process.Pid))
	if err != nil || exe != e2e.Synthetic {
		t.Errorf("the attached worker's pid runs %q (%v), want the trainer %s", exe, err, e2e.Synthetic)
	}
	if found := commandLinesWith(t, secret); len(found) > 0 {
		t.Errorf("the job secret is on command lines:\n%s", strings.Join(found, "\n"))
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", hand.Process.Pid))
	if err != nil || !bytes.Contains(environ, []byte("GOROVOD_SECRET="+secret)) {
		t.Errorf("the attached worker's environment lacks the secret (%v)", err)
	}
	h.Wait(t)
	if err := hand.Wait(); err != nil {
		t.Errorf("the attached worker: %v\n%s", err, handOut.String())
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("job file %s left behind: %v", file, err)
	}
}

// TestAttachRefuses: a job file others could read or write, or that is not
// one, is refused before anything runs; a bad command line is a usage error.
func TestAttachRefuses(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	open := filepath.Join(dir, "open.env")
	if err := os.WriteFile(open, []byte("GOROVOD_JOB_ID=j\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o644)
	good := filepath.Join(dir, "good.env")
	if err := os.WriteFile(good, []byte("GOROVOD_JOB_ID=j\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"attach", open, "--", "touch", marker}, 1, "mode 0644, want 0600"},
		{[]string{"attach", dir, "--", "touch", marker}, 1, "not a regular file"},
		{[]string{"attach", filepath.Join(dir, "missing.env"), "--", "touch", marker}, 1, "no such file"},
		{[]string{"attach", good, "--", filepath.Join(dir, "no-such-trainer")}, 1, "no such file"},
		{[]string{"attach", good}, 2, "no worker command"},
		{[]string{"attach"}, 2, "no job file"},
	} {
		_, errs, code := runGorovod(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying %q", tc.args[1:], code, errs, tc.code, tc.want)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("%v ran the command", tc.args[1:])
		}
	}
	// The file's variables reach the command, over the caller's own.
	out, errs, code := runGorovod(t, "attach", good, "--", "sh", "-c", `echo "job=$GOROVOD_JOB_ID"`)
	if code != 0 || out != "job=j\n" {
		t.Fatalf("attach with a good job file: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestJobFileRemovedOnEveryExit: the job file is gone once `gorovod run`
// has exited, whether the job finished, failed, or was stopped by SIGINT or
// SIGTERM.
func TestJobFileRemovedOnEveryExit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trainer []string
		signal  syscall.Signal // 0: the job ends by itself
	}{
		{"finished", []string{e2e.Synthetic, "--steps", "20", "--compute", "1ms", "--json"}, 0},
		{"failed", []string{"sh", "-c", "exit 3"}, 0},
		{"SIGINT", []string{e2e.Synthetic, "--steps", "100000", "--compute", "5ms", "--json"}, syscall.SIGINT},
		{"SIGTERM", []string{e2e.Synthetic, "--steps", "100000", "--compute", "5ms", "--json"}, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			h := startRunIn(t, tmp, append([]string{"--np", "2", "--"}, tc.trainer...)...)
			file := h.WaitLog(t, "the job file", 60*time.Second, jobFileHint)[1]
			if tc.signal != 0 {
				h.WaitFor(t, "step 3", 60*time.Second, func(l []e2e.TrainerLine) bool { return e2e.MaxStep(l) >= 3 })
				if err := h.Cmd.Process.Signal(tc.signal); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-h.Exited:
			case <-time.After(2 * time.Minute):
				h.TimedOut(t, "the launcher's exit")
			}
			if _, err := os.Stat(file); !os.IsNotExist(err) {
				t.Errorf("job file %s left behind: %v\n%s", file, err, h.LogText())
			}
			if left, _ := filepath.Glob(filepath.Join(tmp, "gorovod-job-*")); len(left) > 0 {
				t.Errorf("job files left in TMPDIR: %v", left)
			}
		})
	}
}

// TestStaleJobFileSwept: a job file left by a launcher killed with kill -9
// is removed by the next `gorovod run`, which leaves alone the file of a
// launcher still running.
func TestStaleJobFileSwept(t *testing.T) {
	tmp := t.TempDir()
	killed := startRunIn(t, tmp, "--np", "1", "--", e2e.Synthetic, "--steps", "100000", "--compute", "5ms", "--json")
	stale := killed.WaitLog(t, "the job file", 60*time.Second, jobFileHint)[1]
	worker, _ := strconv.Atoi(killed.WaitLog(t, "worker 0's pid", 60*time.Second, regexp.MustCompile(`gorovod run: worker 0 pid (\d+)`))[1])
	if err := killed.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(worker, syscall.SIGKILL) // orphaned by the kill -9
	<-killed.Exited
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("kill -9 removed the job file? %v", err)
	}
	running := startRunIn(t, tmp, "--np", "1", "--", e2e.Synthetic, "--steps", "100000", "--compute", "5ms", "--json")
	live := running.WaitLog(t, "the job file", 60*time.Second, jobFileHint)[1]
	next := startRunIn(t, tmp, "--np", "1", "--", e2e.Synthetic, "--steps", "20", "--compute", "1ms", "--json")
	next.Wait(t)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the killed launcher's job file %s is still there: %v", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the running launcher's job file was removed: %v", err)
	}
}
