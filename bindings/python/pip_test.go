package python

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// installedCheck runs in each worker of a job started by the installed
// gorovod command: the package, the library and the command must be the
// ones installed in the virtual environment, the checkout must not be on
// sys.path, and an allreduce must add up.
const installedCheck = `
import os, sys, torch
import gorovod, gorovod.torch as hvd
from gorovod import _core, runner
venv, checkout = os.environ["CHECK_VENV"], os.environ["CHECK_CHECKOUT"]
assert sys.prefix == venv, (sys.prefix, venv)
assert not any(os.path.realpath(p or ".").startswith(checkout + os.sep) for p in sys.path), sys.path
assert gorovod.__file__.startswith(venv + os.sep), gorovod.__file__
hvd.init()
assert _core._lib_path == os.path.realpath(os.path.join(os.path.dirname(gorovod.__file__), "libgorovod.so")), _core._lib_path
# gorovod.run finds the command installed beside this python, off the PATH.
assert runner.command_path() == os.path.join(venv, "bin", "gorovod"), runner.command_path()
got = hvd.allreduce(torch.full((1000,), float(hvd.rank() + 1)), op=hvd.Sum)
want = hvd.size() * (hvd.size() + 1) / 2
assert torch.equal(got, torch.full((1000,), want)), got[:4]
print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
hvd.shutdown()
`

// autoloadCheck runs in the installed python with GOROVOD_JOB_ID set but
// outside any job (argv[1] "job") or without it (argv[1] "plain"). Outside
// a job, start-up imports nothing of gorovod or torch, and importing torch
// registers nothing. With the variable, start-up imports only the package's
// small modules (gorovod._torch_autoload, and gorovod._interrupt, whose hook
// a worker's stop needs before the script imports gorovod), not torch;
// importing torch registers the backend
// with the lazy creator and leaves gorovod.torch.distributed unimported (no
// join, no collective: a Horovod-style script calls hvd.init itself), and
// the finder has left sys.meta_path. With "job broken", the registration
// raises: the failure is a warning on the "gorovod" logger and torch's
// import still succeeds.
const autoloadCheck = `
import logging, sys
mode = sys.argv[1:]
at_start = sorted(m for m in sys.modules if m.split(".")[0] in ("gorovod", "torch"))
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("gorovod").addHandler(Keep())
if mode == ["plain"]:
    assert at_start == [], at_start
    import torch.distributed as dist
    assert not hasattr(dist.Backend, "GOROVOD"), "registered outside a job"
    assert not any(m.startswith("gorovod") for m in sys.modules), sorted(sys.modules)
    print("PASS plain")
    sys.exit(0)
assert at_start == ["gorovod", "gorovod._interrupt", "gorovod._torch_autoload", "gorovod._version", "gorovod.exceptions"], at_start
from gorovod import _torch_autoload
finders = [f for f in sys.meta_path if isinstance(f, _torch_autoload.TorchFinder)]
assert len(finders) == 1, sys.meta_path
if mode == ["job", "broken"]:
    def broken():
        raise RuntimeError("registration broke on purpose")
    _torch_autoload.register_lazily = broken
import torch
import torch.distributed as dist
assert not any(isinstance(f, _torch_autoload.TorchFinder) for f in sys.meta_path), sys.meta_path
assert "gorovod.torch.distributed" not in sys.modules and "gorovod.torch" not in sys.modules, sorted(sys.modules)
if mode == ["job", "broken"]:
    assert not hasattr(dist.Backend, "GOROVOD")
    assert any(r.levelno == logging.WARNING and "registering the torch.distributed backend failed" in r.getMessage()
               and "broke on purpose" in str(r.exc_info[1]) for r in records), [r.getMessage() for r in records]
    print("PASS broken")
    sys.exit(0)
assert dist.Backend._plugins["GOROVOD"].creator_fn is _torch_autoload._create_lazily
# A second registration, the script's own import's or ours, is a no-op.
assert _torch_autoload.register_lazily() is False
assert not records, [r.getMessage() for r in records]
print("PASS job")
`

// withoutImport returns examples/pytorch/ddp_train.py with its import of
// gorovod.torch.distributed replaced by pass: the torchrun script with
// only its backend's name changed.
func withoutImport(t *testing.T, script string) string {
	t.Helper()
	const line = "import gorovod.torch.distributed"
	if strings.Count(script, line) != 1 {
		t.Fatalf("ddp_train.py has %d lines %q, want 1", strings.Count(script, line), line)
	}
	out := strings.Replace(script, line, "pass", 1)
	if strings.Contains(out, "import gorovod") {
		t.Fatalf("ddp_train.py still imports gorovod after the import line was taken out")
	}
	return out
}

// cleanEnv is this process's environment without what would point Python or
// pip elsewhere than the installed package: PYTHONPATH, GOROVOD_LIBRARY,
// GOROVOD, pip's own settings; with the virtual environment's bin off the
// PATH too (the installed command is called by its path).
func cleanEnv(work string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "PYTHONPATH" || name == "PYTHONHOME" || name == "GOROVOD_LIBRARY" || name == "GOROVOD" ||
			name == "VIRTUAL_ENV" || strings.HasPrefix(name, "PIP_") {
			continue
		}
		env = append(env, kv)
	}
	// pip's cache would otherwise go to $HOME/.cache/pip.
	return append(env, "PIP_CACHE_DIR="+filepath.Join(work, "pip-cache"), "PYTHONDONTWRITEBYTECODE=1")
}

// newVenv makes a virtual environment that sees Debian's packages (torch)
// and returns its directory.
func newVenv(t *testing.T, ctx context.Context, env []string) string {
	t.Helper()
	venv := filepath.Join(t.TempDir(), "venv")
	c := exec.CommandContext(ctx, Python, "-m", "venv", "--system-site-packages", venv)
	c.Env = env
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("python3 -m venv: %v\n%s", err, out)
	}
	return venv
}

// distInfo returns the installed package's .dist-info directory.
func distInfo(t *testing.T, venv string) string {
	t.Helper()
	found, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages", "gorovod-*.dist-info"))
	if err != nil || len(found) != 1 {
		t.Fatalf("want one gorovod-*.dist-info in %s, found %v (%v)", venv, found, err)
	}
	return found[0]
}

// checkWheel checks what pip installed against the wheel's own record: the
// WHEEL file's tag (py3, no ABI, this Python's platform) and
// Root-Is-Purelib: false, and every file RECORD lists (the library and the
// command among them) with its size and SHA-256.
func checkWheel(t *testing.T, venv string) {
	t.Helper()
	plat, err := exec.Command(Python, "-c", "import sysconfig; print(sysconfig.get_platform())").Output()
	if err != nil {
		t.Fatal(err)
	}
	wantTag := "py3-none-" + strings.NewReplacer("-", "_", ".", "_").Replace(strings.TrimSpace(string(plat)))
	info := distInfo(t, venv)
	wheel, err := os.ReadFile(filepath.Join(info, "WHEEL"))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(string(wheel)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ": "); ok {
			fields[k] = append(fields[k], v)
		}
	}
	if got := fields["Tag"]; len(got) != 1 || got[0] != wantTag {
		t.Errorf("WHEEL tags %q, want [%s]:\n%s", got, wantTag, wheel)
	}
	if got := fields["Root-Is-Purelib"]; len(got) != 1 || got[0] != "false" {
		t.Errorf("WHEEL Root-Is-Purelib %q, want false (the wheel holds machine code):\n%s", got, wheel)
	}
	f, err := os.Open(filepath.Join(info, "RECORD"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("RECORD: %v", err)
	}
	site := filepath.Dir(info)
	listed := map[string]bool{}
	for _, row := range rows {
		if len(row) != 3 {
			t.Fatalf("RECORD row %q: want 3 fields", row)
		}
		path := filepath.Clean(filepath.Join(site, row[0]))
		listed[path] = true
		if row[1] == "" {
			continue // RECORD itself, and files pip wrote (INSTALLER, ...)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("RECORD lists %s: %v", row[0], err)
			continue
		}
		sum := sha256.Sum256(data)
		if want := "sha256=" + base64.RawURLEncoding.EncodeToString(sum[:]); row[1] != want || row[2] != strconv.Itoa(len(data)) {
			t.Errorf("RECORD has %s,%s for %s; the installed file has %s,%d", row[1], row[2], row[0], want, len(data))
		}
	}
	for _, p := range []string{filepath.Join(site, "gorovod", "libgorovod.so"), filepath.Join(venv, "bin", "gorovod"),
		filepath.Join(site, "gorovod", "torch", "__init__.py"), filepath.Join(site, "gorovod_torch_backend.pth")} {
		if !listed[p] {
			t.Errorf("RECORD does not list %s", p)
		}
	}
	if st, err := os.Stat(filepath.Join(venv, "bin", "gorovod")); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("the gorovod command is not installed as an executable: %v %v", st, err)
	}
}

// TestPipInstall installs ./bindings/python the way the README says, `pip
// install ./bindings/python` with no flags, into a fresh virtual
// environment (pip builds the wheel with the package's own backend: nothing
// comes from an index), checks the wheel, then has the installed `gorovod`
// command run 2 workers of the installed python from a directory outside
// the checkout, with no PYTHONPATH and no GOROVOD_LIBRARY: an allreduce
// (installedCheck) and examples/pytorch/ddp_train.py, with and without its
// import of gorovod.torch.distributed (the installed .pth registers the
// backend; the parameters must end the same). Before that, the .pth's
// effect at start-up outside a job and inside one (autoloadCheck).
func TestPipInstall(t *testing.T) {
	needTorch(t)
	if out, err := exec.Command(Python, "-c", "import ensurepip").CombinedOutput(); err != nil {
		t.Skipf("%s cannot make virtual environments (install python3-venv): %v\n%s", Python, err, out)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	checkout, err := filepath.EvalSymlinks(filepath.Join(here, "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env := cleanEnv(work)
	venv := newVenv(t, ctx, env)
	install := exec.CommandContext(ctx, filepath.Join(venv, "bin", "pip"), "install", here)
	install.Env = env
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", here, err, out)
	}
	t.Logf("pip install took %v", time.Since(start).Round(time.Second))
	checkWheel(t, venv)

	example, err := os.ReadFile(filepath.Join(checkout, "examples", "pytorch", "ddp_train.py"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ name, text string }{{"installed_check.py", installedCheck}, {"ddp_train.py", string(example)},
		{"ddp_train_no_import.py", withoutImport(t, string(example))}, {"autoload_check.py", autoloadCheck}} {
		if err := os.WriteFile(filepath.Join(work, f.name), []byte(f.text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gorovod, python := filepath.Join(venv, "bin", "gorovod"), filepath.Join(venv, "bin", "python")
	// The backend's registration at start-up (gorovod_torch_backend.pth),
	// outside a job and with the job's variable set.
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"autoload outside a job", []string{"plain"}, nil},
		{"autoload in a job", []string{"job"}, []string{"GOROVOD_JOB_ID=autoload-check"}},
		{"autoload failing", []string{"job", "broken"}, []string{"GOROVOD_JOB_ID=autoload-check"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exec.CommandContext(ctx, python, append([]string{"autoload_check.py"}, tc.args...)...)
			c.Dir, c.Env = work, append(append([]string{}, env...), tc.env...)
			out, err := c.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "PASS ") {
				t.Fatalf("autoload_check.py %v: %v\n%s", tc.args, err, out)
			}
		})
	}
	ddpDigests := map[string]map[string]string{}
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{"allreduce", []string{"installed_check.py"}, func(t *testing.T, out string) { wantPasses(t, out, 2) }},
		{"ddp_train", []string{"ddp_train.py", "--backend", "gorovod", "--epochs", "1"}, func(t *testing.T, out string) {
			d := digests(t, out, 2)
			if d["0"] != d["1"] {
				t.Fatalf("the ranks' parameters differ: %v\n%s", d, out)
			}
			ddpDigests["import"] = d
		}},
		// The same script without its import of gorovod.torch.distributed:
		// the installed package registers the backend; the parameters end
		// the same as with the import.
		{"ddp_train without the import", []string{"ddp_train_no_import.py", "--backend", "gorovod", "--epochs", "1"},
			func(t *testing.T, out string) {
				d := digests(t, out, 2)
				if d["0"] != d["1"] {
					t.Fatalf("the ranks' parameters differ: %v\n%s", d, out)
				}
				if with, ok := ddpDigests["import"]; !ok || with["0"] != d["0"] {
					t.Fatalf("without the import the parameters' digest is %s, with it %v\n%s", d["0"], with, out)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := exec.CommandContext(ctx, gorovod, append([]string{"run", "--np", "2", "--min-np", "2", "--", python}, tc.args...)...)
			run.Dir = work
			run.Env = append(env, "CHECK_VENV="+venv, "CHECK_CHECKOUT="+checkout)
			run.WaitDelay = 10 * time.Second
			out, err := run.CombinedOutput()
			if err != nil && !stoppedWhileExiting(t, string(out)) {
				t.Fatalf("the installed gorovod run: %v\n%s", err, out)
			}
			tc.check(t, string(out))
		})
	}
}

// loadInstalled, run by an installed python outside the checkout, prints
// where the package and the library it loads are.
const loadInstalled = `
import gorovod
from gorovod import _core
_core._load()
print("PACKAGE", gorovod.__file__)
print("LIBRARY", _core._lib_path)
`

// runInstalled runs the environment's python (loadInstalled) and its gorovod
// command (version) from dir, and returns the package's and the library's
// paths.
func runInstalled(t *testing.T, ctx context.Context, venv, dir string, env []string) (pkg, lib string) {
	t.Helper()
	c := exec.CommandContext(ctx, filepath.Join(venv, "bin", "python"), "-c", loadInstalled)
	c.Dir, c.Env = dir, env
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("loading the installed package: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "PACKAGE "); ok {
			pkg = v
		} else if v, ok := strings.CutPrefix(line, "LIBRARY "); ok {
			lib = v
		}
	}
	v := exec.CommandContext(ctx, filepath.Join(venv, "bin", "gorovod"), "version")
	v.Dir, v.Env = dir, env
	if out, err := v.CombinedOutput(); err != nil {
		t.Fatalf("the installed gorovod command: %v\n%s", err, out)
	}
	return pkg, lib
}

// TestPipInstallEditable: `pip install -e ./bindings/python` leaves the
// Python sources where they are (the environment imports them from this
// directory), builds the library beside them, and installs the command.
// The library it builds in the tree is removed afterwards; the test skips
// where one is there already (a developer's own editable install).
func TestPipInstallEditable(t *testing.T) {
	needTorch(t)
	if out, err := exec.Command(Python, "-c", "import ensurepip").CombinedOutput(); err != nil {
		t.Skipf("%s cannot make virtual environments (install python3-venv): %v\n%s", Python, err, out)
	}
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	inTree := filepath.Join(here, "gorovod", "libgorovod.so")
	if _, err := os.Stat(inTree); err == nil {
		t.Skipf("%s is there already (an editable install?): not overwriting it", inTree)
	}
	t.Cleanup(func() { _ = os.Remove(inTree) })
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env := cleanEnv(work)
	venv := newVenv(t, ctx, env)
	install := exec.CommandContext(ctx, filepath.Join(venv, "bin", "pip"), "install", "-e", here)
	install.Env = env
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install -e %s: %v\n%s", here, err, out)
	}
	pkg, lib := runInstalled(t, ctx, venv, work, env)
	if want := filepath.Join(here, "gorovod", "__init__.py"); pkg != want {
		t.Errorf("the environment imports gorovod from %s, want the sources at %s", pkg, want)
	}
	if want, _ := filepath.EvalSymlinks(inTree); lib != want || want == "" {
		t.Errorf("the library loaded is %q, want the one built beside the sources, %s", lib, inTree)
	}
}

// TestSdist: the backend's build_sdist makes an archive holding the package
// and the Go sources the wheel is built from, and pip installs from that
// archive alone (unpacked by pip away from the checkout, built by the
// backend from the archive's go/): the library loads and the command runs.
func TestSdist(t *testing.T) {
	needTorch(t)
	if out, err := exec.Command(Python, "-c", "import ensurepip").CombinedOutput(); err != nil {
		t.Skipf("%s cannot make virtual environments (install python3-venv): %v\n%s", Python, err, out)
	}
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	env := cleanEnv(work)
	dist := filepath.Join(work, "dist")
	mk := exec.CommandContext(ctx, Python, "-c",
		"import sys; sys.path.insert(0, 'backend'); import gorovod_build; print(gorovod_build.build_sdist(sys.argv[1]))", dist)
	mk.Env = env
	out, err := mk.CombinedOutput()
	if err != nil {
		t.Fatalf("build_sdist: %v\n%s", err, out)
	}
	archive := filepath.Join(dist, strings.TrimSpace(string(out)))
	names := tarNames(t, archive)
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(archive), "gorovod-"), ".tar.gz")
	top := "gorovod-" + version + "/"
	for _, want := range []string{"PKG-INFO", "pyproject.toml", "backend/gorovod_build.py", "gorovod/__init__.py",
		"gorovod/_version.py", "gorovod/torch/elastic/__init__.py", "go/go.mod", "go/go.sum", "go/LICENSE",
		"go/bindings/c/gorovod.h", "go/bindings/c/exports.go", "go/cmd/gorovod/main.go"} {
		if !names[top+want] {
			t.Errorf("the sdist lacks %s", top+want)
		}
	}
	for name := range names {
		if !strings.HasPrefix(name, top) || strings.HasSuffix(name, "_test.go") || strings.Contains(name, "/testdata/") {
			t.Errorf("the sdist holds %s: not a source the build needs, or outside %s", name, top)
		}
	}
	venv := newVenv(t, ctx, env)
	install := exec.CommandContext(ctx, filepath.Join(venv, "bin", "pip"), "install", archive)
	install.Env = env
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", archive, err, out)
	}
	t.Logf("pip install of the sdist took %v", time.Since(start).Round(time.Second))
	pkg, lib := runInstalled(t, ctx, venv, work, env)
	if !strings.HasPrefix(pkg, venv+string(os.PathSeparator)) || lib != filepath.Join(filepath.Dir(pkg), "libgorovod.so") {
		t.Errorf("want the package and library installed in %s, got %s and %s", venv, pkg, lib)
	}
}

// tarNames returns the names of the regular files in a .tar.gz.
func tarNames(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Typeflag == tar.TypeReg {
			names[h.Name] = true
		}
	}
}

// callBackend calls a hook of the build backend copied into a package
// directory of its own (dir/backend), as pip would from dir, and prints the
// result or "BuildError: <message>".
const callBackend = `
import sys, tempfile
sys.path.insert(0, "backend")
import gorovod_build
try:
    print("OK", getattr(gorovod_build, sys.argv[1])(tempfile.mkdtemp()))
except gorovod_build.BuildError as e:
    print("BuildError:", e)
`

// TestBackendRefusesBadInput: what the backend cannot build as asked
// (pyproject.toml keys it does not handle, a malformed version or licence,
// no Go sources to build from) is refused with a message naming the
// problem, not built into a wrong wheel.
func TestBackendRefusesBadInput(t *testing.T) {
	if _, err := os.Stat(Python); err != nil {
		t.Skipf("%s is missing: %v", Python, err)
	}
	backend, err := os.ReadFile(filepath.Join("backend", "gorovod_build.py"))
	if err != nil {
		t.Fatal(err)
	}
	const good = "[project]\nname = \"gorovod\"\ndynamic = [\"version\"]\nlicense = { text = \"Apache-2.0\" }\n"
	const version = "__version__ = \"0.1.0\"\n"
	for _, tc := range []struct {
		name, pyproject, version, hook, want string
	}{
		{"metadata of a good project", good, version, "prepare_metadata_for_build_wheel", "OK gorovod-0.1.0.dist-info"},
		{"a key it does not handle", good + "dependencies = [\"numpy\"]\n", version, "prepare_metadata_for_build_wheel",
			"BuildError: " + "%s/pyproject.toml: [project] keys this backend does not handle: dependencies"},
		{"another name", strings.Replace(good, `"gorovod"`, `"other"`, 1), version, "prepare_metadata_for_build_wheel",
			"[project] name must be 'gorovod', got 'other'"},
		{"a static version", strings.Replace(good, `dynamic = ["version"]`, `version = "1.0"`, 1), version,
			"prepare_metadata_for_build_wheel", "keys this backend does not handle: version"},
		{"a licence string", strings.Replace(good, `{ text = "Apache-2.0" }`, `"MIT"`, 1), version,
			"prepare_metadata_for_build_wheel", "[project] license must be a table { text = \"...\" }, got 'MIT'"},
		{"a version that is not PEP 440", good, "__version__ = \"one\"\n", "prepare_metadata_for_build_wheel",
			"gorovod/_version.py: __version__ 'one' is not a plain PEP 440 version"},
		{"no version", good, "VERSION = \"0.1.0\"\n", "prepare_metadata_for_build_wheel", "no `__version__ = \"...\"` line"},
		{"no Go sources", good, version, "build_wheel", "gorovod's Go sources (module github.com/gorovod/gorovod) are not where the build looks"},
		{"no Go sources for an sdist", good, version, "build_sdist", "gorovod's Go sources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for path, text := range map[string]string{"backend/gorovod_build.py": string(backend),
				"pyproject.toml": tc.pyproject, "gorovod/_version.py": tc.version} {
				if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, path), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c := exec.Command(Python, "-B", "-c", callBackend, tc.hook)
			c.Dir = dir
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := tc.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, dir)
			}
			if !strings.Contains(string(out), want) {
				t.Fatalf("want %q in:\n%s", want, out)
			}
		})
	}
}
