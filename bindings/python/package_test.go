package python

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/bindings/internal/buildtest"
)

// loadLibrary loads libgorovod through gorovod._core and prints what came of
// it: the path loaded, or the ImportError.
const loadLibrary = `
from gorovod import _core
try:
    _core._load()
except ImportError as e:
    print("ImportError:", e)
else:
    print("LOADED", _core._lib_path)
`

// copyPackage copies the Python sources of the gorovod package (no library)
// to dst/gorovod.
func copyPackage(t *testing.T, dst string) {
	t.Helper()
	err := filepath.WalkDir("gorovod", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".py") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, path)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return os.WriteFile(out, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestImportNeverBuilds: the package finds libgorovod.so only where it is
// told (GOROVOD_LIBRARY) or installed (beside the package), and otherwise
// fails with an error that says how to get one, without building anything,
// even inside what looks like a gorovod checkout with Go on the PATH (every
// worker of a job imports the package: a build there would run once per
// worker).
func TestImportNeverBuilds(t *testing.T) {
	if _, err := os.Stat(Python); err != nil {
		t.Skipf("%s is missing: %v", Python, err)
	}
	lib := filepath.Join(buildtest.Library(t), "libgorovod.so")
	// A checkout without a library: go.mod, the C header, the package.
	root := t.TempDir()
	pkgDir := filepath.Join(root, "bindings", "python")
	copyPackage(t, pkgDir)
	for path, text := range map[string]string{"go.mod": "module github.com/gorovod/gorovod\n\ngo 1.26\n",
		"bindings/c/gorovod.h": "", "bindings/c/main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		library string // GOROVOD_LIBRARY; "" unset
		want    []string
	}{
		{"unset", "", []string{"ImportError:", "GOROVOD_LIBRARY is not set", "pip install ./bindings/python",
			"go build -buildmode=c-shared"}},
		{"missing file", filepath.Join(root, "nowhere", "libgorovod.so"), []string{"ImportError:",
			"GOROVOD_LIBRARY=" + filepath.Join(root, "nowhere", "libgorovod.so") + " is not a file"}},
		{"named", lib, []string{"LOADED " + lib}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := exec.CommandContext(ctx, Python, "-c", loadLibrary)
			c.Dir = root
			c.Env = append(cleanEnv(t.TempDir()), "PYTHONPATH="+pkgDir)
			if tc.library != "" {
				c.Env = append(c.Env, "GOROVOD_LIBRARY="+tc.library)
			}
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("want %q in the output:\n%s", w, out)
				}
			}
			_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), "libgorovod") {
					t.Errorf("importing built or left %s", path)
				}
				return nil
			})
		})
	}
}

// sigtermLogs installs gorovod.torch.elastic's SIGTERM handler outside a job
// and raises SIGTERM: the handler's two warnings (leaving; asking to leave
// failed, since nothing is initialized) must reach a handler on the
// "gorovod" logger, which the script then prints; nothing goes to stderr.
const sigtermLogs = `
import logging, signal
import gorovod.torch.elastic as elastic
class Keep(logging.Handler):
    def emit(self, record):
        print("LOG %s %s %s" % (record.name, record.levelname, record.getMessage()))
log = logging.getLogger("gorovod")
log.addHandler(Keep())
log.propagate = False
previous = elastic._leave_on_sigterm()
signal.raise_signal(signal.SIGTERM)  # its handler has run when this returns
elastic._restore_sigterm(previous)
print("DONE")
`

// TestWarningsGoThroughLogging: the package's messages are records of the
// "gorovod" logger (here gorovod.torch.elastic's when a worker is asked to
// leave), which a script can route or silence, not lines printed to stderr.
func TestWarningsGoThroughLogging(t *testing.T) {
	needTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, Python, "-c", sigtermLogs)
	c.Env = pyEnv(t)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	for _, want := range []string{"LOG gorovod.torch.elastic WARNING SIGTERM: leaving the job",
		"LOG gorovod.torch.elastic WARNING asking to leave failed: gorovod has not been initialized", "DONE"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("want %q in stdout:\n%s", want, &stdout)
		}
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr should be empty (the script's handler took the records):\n%s", &stderr)
	}
}
