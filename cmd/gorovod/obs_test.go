package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		out, errs, code := runGorovod(t, arg)
		if code != 0 || !strings.HasPrefix(out, "github.com/gorovod/gorovod ") || !strings.Contains(out, ", commit ") || !strings.Contains(out, "go1.") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", arg, code, out, errs)
		}
	}
	// The commit: Go stamps it only when building inside a clone (a .git
	// directory; git worktrees have a .git file and are not stamped).
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Skipf("%s is not a git clone (a worktree or an export): no commit to check", root)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("git rev-parse: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "gorovod")
	build := exec.CommandContext(ctx, "go", "build", "-buildvcs=true", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, _, code := runWith(t, bin, "--version")
	if want := ", commit " + strings.TrimSpace(string(head)); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("--version printed %q, want it to contain %q", out, want)
	}
}

// TestHelpExitsZero: asking for help is not an error.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"run", "--help"}, {"bench", "--help"}, {"bench", "allreduce", "-h"}, {"report", "--help"}, {"attach", "--help"}} {
		out, errs, code := runGorovod(t, args...)
		if code != 0 || !strings.Contains(out+errs, "Usage") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	out, _, _ := runGorovod(t, "bench", "--help")
	if !strings.Contains(out, "--transport: auto (the default)") || strings.Contains(out, "TCP loopback") {
		t.Errorf("bench's usage does not say how workers talk:\n%s", out)
	}
}

// TestBenchErrorsArePrefixed: every error bench prints starts with
// "gorovod bench:".
func TestBenchErrorsArePrefixed(t *testing.T) {
	for _, args := range [][]string{{"bench", "--bogus"}, {"bench", "--np", "0"}, {"bench", "--min-bytes", "4Q"}} {
		_, errs, code := runGorovod(t, args...)
		if code != 2 || !strings.HasPrefix(errs, "gorovod bench: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errs)
		}
	}
}

// TestReportCommand renders the recorded run of observe/report/testdata and checks
// the command's mistakes.
func TestReportCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	out, errs, code := runGorovod(t, "report", "--out", dir, "../../observe/report/testdata/scaling-efficiency.jsonl")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	files := strings.Fields(out)
	if len(files) != 9 || files[0] != filepath.Join(dir, "index.html") {
		t.Fatalf("printed %q", out)
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	notRun := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notRun, []byte("hello\n{\"a\":1}\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"report"}, 2, "gorovod report: want one RUN.jsonl file"},
		{[]string{"report", "-"}, 2, "gorovod report: reading stdin: say where the report goes with --out"},
		{[]string{"report", "--log-level", "loud", "x"}, 2, `gorovod report: log level "loud"`},
		{[]string{"report", "/nonexistent/run.jsonl"}, 1, "gorovod report: open /nonexistent/run.jsonl"},
		{[]string{"report", notRun}, 1, "holds none of gorovod run's JSON lines"},
	} {
		_, errs, code := runGorovod(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
