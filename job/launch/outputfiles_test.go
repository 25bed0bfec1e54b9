package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestStartProcessOutput runs a process that prints 1,000 lines and a last
// one without a newline, through pipes and through output files: Output gets
// every line of this run in order either way, and the files hold what the
// process wrote after what they held before (an earlier run of the same
// worker's files), which Output does not get again.
func TestStartProcessOutput(t *testing.T) {
	for _, files := range []bool{false, true} {
		t.Run(fmt.Sprintf("files=%v", files), func(t *testing.T) {
			var mu sync.Mutex
			got := map[string][]string{}
			spec := ProcessSpec{
				Argv: []string{os.Args[0]}, Env: []string{envChild + "=lines"},
				Output: func(stream string, line []byte) {
					mu.Lock()
					defer mu.Unlock()
					got[stream] = append(got[stream], string(line))
				},
			}
			prefix := filepath.Join(t.TempDir(), "worker-0")
			const before = "an earlier run's line\n"
			if files {
				spec.OutputFiles = prefix
				if err := os.WriteFile(prefix+".stdout", []byte(before), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, err := StartProcess(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-ctx.Done():
				t.Fatal("the process did not exit")
			}
			if err := p.Err(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			var want []string
			for i := range 1000 {
				want = append(want, fmt.Sprintf("line %d", i))
			}
			if strings.Join(got["stdout"], "\n") != strings.Join(want, "\n") {
				t.Errorf("stdout: got %d lines (first %q), want line 0 to line 999", len(got["stdout"]), first(got["stdout"]))
			}
			if strings.Join(got["stderr"], "|") != "no newline at the end" {
				t.Errorf("stderr: got %q", got["stderr"])
			}
			if !files {
				return
			}
			b, err := os.ReadFile(prefix + ".stdout")
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != before+strings.Join(want, "\n")+"\n" {
				t.Errorf("the stdout file holds %d bytes, not the earlier line and the 1,000 lines", len(b))
			}
			if b, err := os.ReadFile(prefix + ".stderr"); err != nil || string(b) != "no newline at the end" {
				t.Errorf("the stderr file holds %q (%v)", b, err)
			}
			fi, err := os.Stat(prefix + ".stderr")
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("the stderr file's mode: %v (%v), want 0600", fi.Mode(), err)
			}
		})
	}
}

func first(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return lines[0]
}

// TestStopWakesAPausedProcess: a process paused (SIGSTOP) when its context
// ends gets its stop signal and SIGCONT, through pipes and through output
// files: it acts on the signal at once (here: its last line, exit 0)
// instead of being killed after the grace, a minute here, without it.
func TestStopWakesAPausedProcess(t *testing.T) {
	for _, files := range []bool{false, true} {
		t.Run(fmt.Sprintf("files=%v", files), func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			ready := make(chan struct{})
			spec := ProcessSpec{
				Argv: []string{os.Args[0]}, Env: []string{envChild + "=pause"},
				StopSignal: syscall.SIGINT, StopGrace: time.Minute,
				Output: func(stream string, line []byte) {
					mu.Lock()
					defer mu.Unlock()
					if got = append(got, string(line)); string(line) == "ready" {
						close(ready)
					}
				},
			}
			if files {
				spec.OutputFiles = filepath.Join(t.TempDir(), "worker-0")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			p, err := StartProcess(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL) })
			select {
			case <-ready:
			case <-time.After(20 * time.Second):
				t.Fatal("the process never said it was ready")
			}
			waitPaused(t, p.PID())
			cancel()
			select {
			case <-p.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the paused process did not act on its stop signal")
			}
			// Status 0 after a stop reads as the context's error (os/exec).
			if err := p.Err(); !errors.Is(err, context.Canceled) {
				t.Fatalf("exit: %v, want status 0 (it caught SIGINT), which reads as %v", err, context.Canceled)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []string{"ready", "stopped by SIGINT"}; !slices.Equal(got, want) {
				t.Fatalf("output %q, want %q", got, want)
			}
		})
	}
}

// waitPaused waits until process pid is stopped (state T in
// /proc/PID/stat): a process's stop is seen only by its parent's wait, and
// os/exec's waits for its exit alone, so it is looked for here.
func waitPaused(t *testing.T, pid int) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && f[0] == "T" {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("process %d never paused", pid)
		}
	}
}
