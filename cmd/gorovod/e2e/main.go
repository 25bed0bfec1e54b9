package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Binary is the gorovod command built once for the tests (with -race): bench
// re-executes itself as its workers, so the tests need a real executable.
// Synthetic is the elastic example trainer the run tests launch;
// CustomLauncher is gorovod's command line with a Go heuristic added. Main
// builds them all before the tests run and sets these paths; nothing changes
// them afterwards.
var Binary, Synthetic, FashionMNIST, HeuristicPlugin, CustomLauncher string

// buildDir holds the programs built for the tests (removed at the end).
var buildDir string

// moduleRoot is the directory of the checkout's go.mod, as the go command
// finds it from the test's directory (Main sets it).
var moduleRoot string

// module is the import path every program the tests build is named by, so
// that a test package in any directory of the module builds the same ones.
const module = "github.com/gorovod/gorovod"

// Main is the TestMain of every package of gorovod's end-to-end tests: it
// builds the programs the tests run (Binary and the others), runs the tests
// and removes the programs. It returns the exit code for os.Exit.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gorovod-cmd-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	buildDir = dir
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		fmt.Fprintf(os.Stderr, "finding the module's go.mod (go env GOMOD: %q): %v\n", gomod, err)
		return 1
	}
	moduleRoot = filepath.Dir(strings.TrimSpace(string(gomod)))
	programs := []struct {
		path *string
		out  string
		pkg  string
		race bool
	}{
		{&Binary, "gorovod", "cmd/gorovod", true},
		{&Synthetic, "synthetic", "examples/synthetic", false},
		{&FashionMNIST, "fashion-mnist", "examples/fashion-mnist", false},
		{&HeuristicPlugin, "heuristic-plugin", "examples/heuristic-plugin", false},
		{&CustomLauncher, "custom-launcher", "examples/custom-launcher", true},
	}
	for _, p := range programs {
		path := filepath.Join(dir, p.out)
		var flags []string
		if p.race {
			flags = []string{"-race"}
		}
		cmd := exec.Command("go", slices.Concat([]string{"build"}, flags, []string{"-o", path, module + "/" + p.pkg})...)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %s: %v\n", p.pkg, err)
			return 1
		}
		*p.path = path
	}
	return m.Run()
}

// plainBinary is gorovod built without the race detector, once, for the
// tests that measure how long something takes (PlainLauncher).
var plainBinary = sync.OnceValues(func() (string, error) {
	path := filepath.Join(buildDir, "gorovod-plain")
	out, err := exec.Command("go", "build", "-o", path, module+"/cmd/gorovod").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building gorovod without -race: %v\n%s", err, out)
	}
	return path, nil
})

// PlainLauncher is the gorovod command as users run it, without the race
// detector, for the measurements of a job's timings: Binary, built with
// -race for the other tests, runs its Go code several times slower, and in
// a job it is the launcher and the driver — the process every world change
// goes through. (Measured so, a graceful leave at 16 workers took about
// four times as long as with this build: docs/multihost.md, "Transition
// times".)
func PlainLauncher(t *testing.T) string {
	t.Helper()
	path, err := plainBinary()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Path is rel (slash-separated, from the module's root) in the checkout the
// tests run from, whichever test package's directory that is.
func Path(rel string) string {
	return filepath.Join(moduleRoot, filepath.FromSlash(rel))
}
