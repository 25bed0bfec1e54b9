package fakecuda

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// source is testdata/fakedriver.c, embedded so that a test binary built
// with -trimpath and run elsewhere (bench/gpu's cuda.test on the GPU
// machine) builds the same driver as go test does here.
//
//go:embed testdata/fakedriver.c
var source string

// Build compiles testdata/fakedriver.c with gcc (and the extra flags given, such as
// -DFAKE_NO_IPC) into a new directory of t's and returns the library's path;
// the file is named libcuda.so.1, so that the dynamic loader finds it by the
// driver's name when LD_LIBRARY_PATH names its directory. Without gcc the
// test is skipped.
func Build(t *testing.T, cflags ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skipf("no gcc to build the fake CUDA driver with: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fakedriver.c")
	if err := os.WriteFile(src, []byte(source), 0o644); err != nil {
		t.Fatalf("fakecuda: %v", err)
	}
	so := filepath.Join(dir, "libcuda.so.1")
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", so}, cflags...)
	args = append(args, src, "-lpthread")
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return so
}
