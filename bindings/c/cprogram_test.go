package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// cProgram is a C test program in testdata/, compiled against a header of
// this package and libgorovod.so, that prints okLine once per worker that
// passed.
type cProgram struct {
	source string   // under testdata/
	libs   []string // extra linker flags
	okLine string
	np     int      // workers of the run under `gorovod run`
	tags   string   // build tags of the library it runs against ("": the default build)
	env    []string // added to its environment (and its workers')
}

// run compiles p and runs it alone (a world of one) and as p.np workers
// under `gorovod run`; each worker learns the expected world size from
// ABI_TEST_SIZE.
func (p cProgram) run(t *testing.T) {
	t.Helper()
	lib := buildtest.Library(t)
	if p.tags != "" {
		lib = buildtest.LibraryTagged(t, p.tags)
	}
	bin := filepath.Join(t.TempDir(), strings.TrimSuffix(p.source, ".c"))
	args := []string{"-Wall", "-Wextra", "-Werror", "-std=c11", "-D_GNU_SOURCE", "-I", ".",
		filepath.Join("testdata", p.source), "-L", lib, "-lgorovod", "-Wl,-rpath," + lib}
	args = append(append(args, p.libs...), "-o", bin)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	np := strconv.Itoa(p.np)
	for _, tc := range []struct {
		name string
		argv []string
		want int
	}{
		{"alone", []string{bin}, 1},
		{np + " workers", []string{buildtest.Gorovod(t), "run", "--np", np, "--min-np", np, "--", bin}, p.np},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, tc.argv[0], tc.argv[1:]...)
			c.Env = append(append(os.Environ(), p.env...), "ABI_TEST_SIZE="+strconv.Itoa(tc.want))
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if n := strings.Count(string(out), p.okLine); n != tc.want {
				t.Fatalf("%d workers passed, want %d:\n%s", n, tc.want, out)
			}
		})
	}
}

// headerIsCPlusPlus checks that a header of this package compiles as C++.
func headerIsCPlusPlus(t *testing.T, header string) {
	t.Helper()
	cxx, err := exec.LookPath("c++")
	if err != nil {
		t.Skip("no C++ compiler")
	}
	c := exec.Command(cxx, "-fsyntax-only", "-Wall", "-Werror", "-x", "c++", header)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
