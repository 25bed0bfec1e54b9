package launch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
