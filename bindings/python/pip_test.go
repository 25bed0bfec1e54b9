package python

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

// pipCheck runs in each worker from the installed copy: the package and the
// library must be the installed ones, and an allreduce must add up.
const pipCheck = `
import os, sys, torch
import gorovod, gorovod.torch as hvd
from gorovod import _core
target = os.environ["PIP_TARGET_DIR"]
hvd.init()
assert gorovod.__file__.startswith(target + os.sep), gorovod.__file__
assert _core._lib_path == os.path.realpath(os.path.join(target, "gorovod", "libgorovod.so")), _core._lib_path
got = hvd.allreduce(torch.full((1000,), float(hvd.rank() + 1)), op=hvd.Sum)
want = hvd.size() * (hvd.size() + 1) / 2
assert torch.equal(got, torch.full((1000,), want)), got[:4]
print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
hvd.shutdown()
`

// TestPipInstall installs ./bindings/python the way the README says (pip,
// no build isolation, nothing from an index) into a throwaway target, then
// runs an allreduce at 2 workers from the installed copy alone: run outside
// the checkout, without GOROVOD_LIBRARY, with only the target on the
// PYTHONPATH.
func TestPipInstall(t *testing.T) {
	needTorch(t)
	if out, err := exec.Command(Python, "-m", "pip", "--version").CombinedOutput(); err != nil {
		t.Skipf("pip is missing for %s (install python3-pip): %v\n%s", Python, err, out)
	}
	// pip builds in the source tree: remove what it leaves there, unless it
	// was there before.
	for _, p := range []string{"build", "gorovod.egg-info"} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { _ = os.RemoveAll(p) })
		}
	}
	target, work := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PYTHONPATH=") && !strings.HasPrefix(kv, "GOROVOD_LIBRARY=") && !strings.HasPrefix(kv, "PIP_") {
			env = append(env, kv)
		}
	}
	env = append(env, "PIP_CACHE_DIR="+filepath.Join(work, "pip-cache"), "PYTHONDONTWRITEBYTECODE=1")
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	install := exec.CommandContext(ctx, Python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
		"--target", target, here)
	install.Env = env
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	t.Logf("pip install took %v", time.Since(start).Round(time.Second))
	if _, err := os.Stat(filepath.Join(target, "gorovod", "libgorovod.so")); err != nil {
		t.Fatalf("the installed package has no library: %v", err)
	}
	run := exec.CommandContext(ctx, buildtest.Gorovod(t), "run", "--np", "2", "--min-np", "2", "--", Python, "-c", pipCheck)
	run.Dir = work
	run.Env = append(env, "PYTHONPATH="+target, "PIP_TARGET_DIR="+target)
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the installed copy under gorovod run: %v\n%s", err, out)
	}
	wantPasses(t, string(out), 2)
}
