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

func TestMain(m *testing.M) {
	code := m.Run()
	buildtest.Cleanup()
	os.Exit(code)
}

// TestCProgram compiles testdata/abi_test.c with cc against gorovod.h and
// libgorovod.so, and runs it alone (a world of one) and as 3 workers under
// `gorovod run`: every collective, the handles, the errors, a forked child.
func TestCProgram(t *testing.T) {
	lib := buildtest.Library(t)
	bin := filepath.Join(t.TempDir(), "abi_test")
	cc := exec.Command("cc", "-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE", "-I", ".",
		"testdata/abi_test.c", "-L", lib, "-lgorovod", "-Wl,-rpath,"+lib, "-lpthread", "-o", bin)
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"alone", []string{bin}, 1},
		{"3 workers", []string{buildtest.Gorovod(t), "run", "--np", "3", "--min-np", "3", "--", bin}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, tc.argv[0], tc.argv[1:]...)
			c.Env = append(os.Environ(), "ABI_TEST_SIZE="+string(rune('0'+tc.want)))
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if n := strings.Count(string(out), "abi test ok"); n != tc.want {
				t.Fatalf("%d workers passed, want %d:\n%s", n, tc.want, out)
			}
		})
	}
}

// TestHeaderIsCPlusPlus checks that gorovod.h compiles as C++ too.
func TestHeaderIsCPlusPlus(t *testing.T) {
	cxx, err := exec.LookPath("c++")
	if err != nil {
		t.Skip("no C++ compiler")
	}
	c := exec.Command(cxx, "-fsyntax-only", "-Wall", "-Werror", "-x", "c++", "gorovod.h")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
