package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// TestAdaptiveCProgram compiles testdata/adaptive_test.c against
// gorovod_adaptive.h and libgorovod.so and runs it alone and as 2 workers
// under `gorovod run`: its errors, and the adaptive loop growing the batch
// with every rank on the same plan.
func TestAdaptiveCProgram(t *testing.T) {
	lib := buildtest.Library(t)
	bin := filepath.Join(t.TempDir(), "adaptive_test")
	cc := exec.Command("cc", "-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE", "-I", ".",
		"testdata/adaptive_test.c", "-L", lib, "-lgorovod", "-Wl,-rpath,"+lib, "-lm", "-o", bin)
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"alone", []string{bin}, 1},
		{"2 workers", []string{buildtest.Gorovod(t), "run", "--np", "2", "--min-np", "2", "--", bin}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, tc.argv[0], tc.argv[1:]...)
			c.Env = os.Environ()
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if n := strings.Count(string(out), "adaptive test ok"); n != tc.want {
				t.Fatalf("%d workers passed, want %d:\n%s", n, tc.want, out)
			}
			t.Logf("%s", out)
		})
	}
}

// TestAdaptiveHeaderIsCPlusPlus checks that gorovod_adaptive.h compiles as
// C++ too.
func TestAdaptiveHeaderIsCPlusPlus(t *testing.T) {
	cxx, err := exec.LookPath("c++")
	if err != nil {
		t.Skip("no C++ compiler")
	}
	c := exec.Command(cxx, "-fsyntax-only", "-Wall", "-Werror", "-x", "c++", "gorovod_adaptive.h")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
