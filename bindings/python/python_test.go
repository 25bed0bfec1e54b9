package python

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// Python is the interpreter the bindings are tested with: Debian's, where
// python3-torch lives.
const Python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	code := m.Run()
	buildtest.Cleanup()
	os.Exit(code)
}

// needTorch skips the test when Debian's python3 or torch is missing.
func needTorch(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		t.Skipf("%s is missing (install python3-torch): %v", Python, err)
	}
	if out, err := exec.Command(Python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("torch cannot be imported by %s (install python3-torch): %v\n%s", Python, err, out)
	}
}

// pyEnv is the environment a Python worker runs in: the package straight
// from this checkout, the library the test built.
func pyEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	lib := buildtest.Library(t)
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOROVOD_LIBRARY="+filepath.Join(lib, "libgorovod.so"), "PYTHONPATH="+here,
		"PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1")
	return append(env, extra...)
}

// runPython runs Python with args alone (np 0) or as np workers under
// `gorovod run --np np --min-np np`, and returns what it printed. It fails
// the test when the command fails or outlives limit.
func runPython(t *testing.T, np int, limit time.Duration, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	argv := append([]string{Python}, args...)
	if np > 0 {
		n := strconv.Itoa(np)
		argv = append([]string{buildtest.Gorovod(t), "run", "--np", n, "--min-np", n, "--"}, argv...)
	}
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Env = env
	c.WaitDelay = 10 * time.Second
	out, err := c.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s: no result within %v\n%s", strings.Join(argv, " "), limit, out)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

var passLine = regexp.MustCompile(`PASS rank (\d+) of (\d+)`)

// wantPasses checks that every rank 0..n-1 of a world of n printed its PASS
// line.
func wantPasses(t *testing.T, out string, n int) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range passLine.FindAllStringSubmatch(out, -1) {
		if m[2] != strconv.Itoa(n) {
			t.Fatalf("a rank passed in a world of %s, want %d:\n%s", m[2], n, out)
		}
		seen[m[1]] = true
	}
	for r := 0; r < n; r++ {
		if !seen[strconv.Itoa(r)] {
			t.Fatalf("rank %d did not pass (world of %d):\n%s", r, n, out)
		}
	}
}

// TestCollectives runs every collective × dtype × reduce op against torch's
// own result, plus bad input, alone and at 2, 3 and 4 workers.
func TestCollectives(t *testing.T) {
	needTorch(t)
	for _, np := range []int{0, 2, 3, 4} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			out := runPython(t, np, 5*time.Minute, pyEnv(t), "tests/ops_test.py")
			wantPasses(t, out, max(np, 1))
		})
	}
}

// TestForkAndMismatch: a DataLoader with forked workers beside collectives,
// a forked child calling gorovod, and ranks that call mismatched
// collectives.
func TestForkAndMismatch(t *testing.T) {
	needTorch(t)
	for _, np := range []int{0, 2} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			out := runPython(t, np, 5*time.Minute, pyEnv(t), "tests/misc_test.py")
			wantPasses(t, out, max(np, 1))
			if np > 1 && strings.Count(out, "MismatchError") != np {
				t.Fatalf("want a MismatchError on each of %d ranks:\n%s", np, out)
			}
		})
	}
}
