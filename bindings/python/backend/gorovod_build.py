"""gorovod's PEP 517 build backend, written with the standard library only.

pip builds a package in an isolated environment into which it first installs
the backend's requirements from an index; this backend has none
(pyproject.toml: ``requires = []``, ``backend-path = ["backend"]``), so
``pip install ./bindings/python`` works without any index.

The wheel carries two things built from the repository's Go sources:

- ``gorovod/libgorovod.so``: ``go build -buildmode=c-shared ./bindings/c``,
  the library the package loads with ctypes;
- ``gorovod-<version>.data/scripts/gorovod``: ``go build ./cmd/gorovod``,
  the launcher, which pip installs beside the environment's python.

It also carries ``gorovod_torch_backend.pth`` (AUTOLOAD_PTH), which Python
runs at start-up: inside a gorovod job (GOROVOD_JOB_ID set) it imports
gorovod._torch_autoload, which registers the "gorovod" torch.distributed
backend once the script imports torch; elsewhere it imports nothing.

Neither depends on Python's ABI, but both are machine code for one platform:
the wheel is tagged ``py3-none-<platform>`` (the platform of the Python
running the build) with ``Root-Is-Purelib: false``, and Go is told to build
for that platform. Go (``go`` on the PATH) and a C compiler (cgo) are needed,
and Python 3.11 or later to build (tomllib reads pyproject.toml).

The Go sources are the checkout's (its root is two levels above
bindings/python) when building from a checkout, or the copy in ``go/``
inside an sdist made by build_sdist.
"""

import ast
import base64
import csv
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

# bindings/python: pyproject.toml, gorovod/, backend/.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "gorovod"
MODULE_PATH = "github.com/gorovod/gorovod"
LIBRARY = "libgorovod.so"
COMMAND = "gorovod"
# Where build_sdist puts the Go module inside the sdist.
SDIST_GO_DIR = "go"
# The Go packages the wheel is built from.
GO_LIBRARY_PACKAGE = "./bindings/c"
GO_COMMAND_PACKAGE = "./cmd/gorovod"
# Run by site at every start of the environment's Python: one test of the
# environment outside a gorovod job. Named to sort after the editable
# install's .pth, which puts the sources on sys.path first.
AUTOLOAD_PTH = ("gorovod_torch_backend.pth",
                b"import os; 'GOROVOD_JOB_ID' in os.environ and __import__('gorovod._torch_autoload')\n")

# Python's machine names (sysconfig.get_platform(): "linux-<machine>") and
# Go's GOARCH for them.
_GOARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "i686": "386",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}

# pyproject.toml [project] keys this backend reads; any other is refused
# rather than silently left out of the wheel.
_PROJECT_KEYS = {"name", "dynamic", "description", "license", "requires-python", "optional-dependencies"}


class BuildError(Exception):
    """The package cannot be built as asked; the message says why."""


# ---- What is built: metadata, platform, Go sources ----

def _version():
    """__version__ from gorovod/_version.py, read without importing it."""
    path = os.path.join(PACKAGE_ROOT, PACKAGE, "_version.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__version__" and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            version = node.value.value
            if not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", version):
                raise BuildError("%s: __version__ %r is not a plain PEP 440 version" % (path, version))
            return version
    raise BuildError("%s: no `__version__ = \"...\"` line" % path)


def _project():
    """pyproject.toml's [project] table, checked, with the version filled in."""
    try:
        import tomllib
    except ImportError:
        raise BuildError("building gorovod needs Python 3.11 or later (tomllib reads pyproject.toml); this is %s"
                         % sys.version.split()[0])
    path = os.path.join(PACKAGE_ROOT, "pyproject.toml")
    with open(path, "rb") as f:
        project = tomllib.load(f).get("project")
    if not isinstance(project, dict):
        raise BuildError("%s has no [project] table" % path)
    unknown = sorted(set(project) - _PROJECT_KEYS)
    if unknown:
        raise BuildError("%s: [project] keys this backend does not handle: %s" % (path, ", ".join(unknown)))
    if project.get("name") != PACKAGE:
        raise BuildError("%s: [project] name must be %r, got %r" % (path, PACKAGE, project.get("name")))
    if project.get("dynamic") != ["version"]:
        raise BuildError("%s: [project] dynamic must be [\"version\"] (the version is gorovod/_version.py's)" % path)
    licence = project.get("license", {"text": ""})
    if not (isinstance(licence, dict) and set(licence) == {"text"} and isinstance(licence["text"], str)):
        raise BuildError("%s: [project] license must be a table { text = \"...\" }, got %r" % (path, licence))
    return dict(project, version=_version())


def _metadata(project):
    """The METADATA (and PKG-INFO) text, core metadata 2.1."""
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"], "Version: " + project["version"]]
    if "description" in project:
        lines.append("Summary: " + project["description"])
    if "license" in project:
        lines.append("License: " + project["license"]["text"])
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    for extra, requirements in sorted(project.get("optional-dependencies", {}).items()):
        lines.append("Provides-Extra: " + extra)
        for req in requirements:
            lines.append('Requires-Dist: %s; extra == "%s"' % (req, extra))
    return "\n".join(lines) + "\n"


def _platform():
    """(wheel tag, GOOS, GOARCH) for the platform of the Python running the
    build; the tag is py3-none-<platform>: any Python 3, no Python ABI."""
    plat = sysconfig.get_platform()
    system, _, machine = plat.partition("-")
    if system != "linux":
        raise BuildError("gorovod builds for Linux only; this Python's platform is %s" % plat)
    if machine not in _GOARCH:
        raise BuildError("gorovod's build does not know Go's GOARCH for the machine %r (platform %s)" % (machine, plat))
    return "py3-none-" + re.sub(r"[-.]", "_", plat), "linux", _GOARCH[machine]


def _go_root():
    """The Go module's root: the checkout this package is in, or the copy
    inside an unpacked sdist."""
    for root in (os.path.join(PACKAGE_ROOT, SDIST_GO_DIR), os.path.dirname(os.path.dirname(PACKAGE_ROOT))):
        mod = os.path.join(root, "go.mod")
        if os.path.isfile(mod):
            with open(mod, encoding="utf-8") as f:
                if re.search(r"^module\s+%s\s*$" % re.escape(MODULE_PATH), f.read(), re.M):
                    return root
    raise BuildError("gorovod's Go sources (module %s) are not where the build looks: %s, or a %s/ directory of "
                     "an sdist beside pyproject.toml; build from a gorovod checkout (pip install ./bindings/python)"
                     % (MODULE_PATH, os.path.dirname(os.path.dirname(PACKAGE_ROOT)), SDIST_GO_DIR))


def _go(args, root, goos, goarch):
    """Runs `go args...` in root for goos/goarch with cgo on; returns its
    standard output."""
    env = dict(os.environ, GOOS=goos, GOARCH=goarch, CGO_ENABLED="1")
    try:
        done = subprocess.run(["go"] + args, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise BuildError("building gorovod needs Go: the `go` command is not on the PATH (https://go.dev/dl/, or "
                         "Debian's golang-go if it is recent enough for go.mod)")
    if done.returncode != 0:
        raise BuildError("`go %s` in %s failed (exit %d):\n%s" % (" ".join(args), root, done.returncode,
                                                                  done.stderr.decode(errors="replace")))
    return done.stdout


def _build_go(out_dir):
    """Builds the library and the command into out_dir; returns their paths
    and the platform tag."""
    tag, goos, goarch = _platform()
    root = _go_root()
    lib, cmd = os.path.join(out_dir, LIBRARY), os.path.join(out_dir, COMMAND)
    # The compile flags are those of a plain `go build`, so that Go's build
    # cache serves what the developer or the tests already compiled (-trimpath
    # would recompile everything, the standard library included: minutes on a
    # small machine). -s -w leave the symbol and debug tables out of what is
    # installed (the command: 62 MB instead of 85 MB); panics still
    # name functions and lines, and the library's exported symbols stay.
    link = "-ldflags=-s -w"
    _go(["build", "-buildmode=c-shared", link, "-o", lib, GO_LIBRARY_PACKAGE], root, goos, goarch)
    _go(["build", link, "-o", cmd, GO_COMMAND_PACKAGE], root, goos, goarch)
    return lib, cmd, tag


def _package_files():
    """(path inside the package root, file path) of the Python package's
    sources: every .py under gorovod/."""
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(PACKAGE_ROOT, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                found.append((os.path.relpath(path, PACKAGE_ROOT).replace(os.sep, "/"), path))
    return found


def _timestamp():
    """The time stamped on archive entries: SOURCE_DATE_EPOCH when set (for
    reproducible builds), else 1980-01-01, the earliest a zip holds."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch is None:
        return 315532800
    if not epoch.isdigit():
        raise BuildError("SOURCE_DATE_EPOCH must be a number of seconds, got %r" % epoch)
    return max(int(epoch), 315532800)


# ---- Wheels ----

class _Wheel:
    """A wheel being written: every file added is hashed into RECORD."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records = []
        self.date_time = time.gmtime(_timestamp())[:6]

    def add(self, arcname, data, executable=False):
        info = zipfile.ZipInfo(arcname, self.date_time)
        info.compress_type = zipfile.ZIP_DEFLATED
        # pip sets the executable bits of an installed file from these.
        info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
        self.zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self.records.append((arcname, "sha256=" + digest, str(len(data))))

    def add_file(self, arcname, path, executable=False):
        with open(path, "rb") as f:
            self.add(arcname, f.read(), executable)

    def close(self, record_name):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerows(self.records)
        writer.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, self.date_time)
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        self.zip.writestr(info, out.getvalue())
        self.zip.close()


def _dist_info_files(project, tag):
    """The .dist-info files other than RECORD, by name."""
    wheel = ("Wheel-Version: 1.0\nGenerator: gorovod_build %s\nRoot-Is-Purelib: false\nTag: %s\n"
             % (project["version"], tag))
    return {"METADATA": _metadata(project), "WHEEL": wheel, "top_level.txt": PACKAGE + "\n"}


def _names(project):
    base = "%s-%s" % (project["name"], project["version"])
    return base, base + ".dist-info", base + ".data"


def _write_wheel(wheel_directory, project, tag, contents, command):
    """Writes the wheel: contents ((arcname, bytes) pairs at the wheel's root),
    the command as a script, and the .dist-info; returns its file name."""
    base, dist_info, data = _names(project)
    name = "%s-%s.whl" % (base, tag)
    os.makedirs(wheel_directory, exist_ok=True)
    tmp = os.path.join(wheel_directory, ".%s.%d.tmp" % (name, os.getpid()))
    wheel = _Wheel(tmp)
    try:
        for arcname, payload in contents:
            wheel.add(arcname, payload)
        wheel.add_file("%s/scripts/%s" % (data, COMMAND), command, executable=True)
        for fname, text in sorted(_dist_info_files(project, tag).items()):
            wheel.add("%s/%s" % (dist_info, fname), text.encode())
        wheel.close(dist_info + "/RECORD")
        os.replace(tmp, os.path.join(wheel_directory, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = _project()
    tag = _platform()[0]
    _, dist_info, _ = _names(project)
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for fname, text in _dist_info_files(project, tag).items():
        with open(os.path.join(metadata_directory, dist_info, fname), "w", encoding="utf-8") as f:
            f.write(text)
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    project = _project()
    with tempfile.TemporaryDirectory(prefix="gorovod-build-") as out:
        lib, cmd, tag = _build_go(out)
        contents = [(arcname, _read(path)) for arcname, path in _package_files()]
        contents.append(("%s/%s" % (PACKAGE, LIBRARY), _read(lib)))
        contents.append(AUTOLOAD_PTH)
        return _write_wheel(wheel_directory, project, tag, contents, cmd)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth puts this directory on sys.path, so the
    Python sources are used where they are; the library is built into
    gorovod/ here (rebuild it, by installing again, after changing Go
    sources), the command into the environment's scripts."""
    project = _project()
    with tempfile.TemporaryDirectory(prefix="gorovod-build-") as out:
        lib, cmd, tag = _build_go(out)
        # Replaced in one step: a process may have the old one loaded.
        dest = os.path.join(PACKAGE_ROOT, PACKAGE, LIBRARY)
        shutil.copyfile(lib, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        contents = [("%s_editable.pth" % PACKAGE, (PACKAGE_ROOT + "\n").encode()), AUTOLOAD_PTH]
        return _write_wheel(wheel_directory, project, tag, contents, cmd)


# ---- Sdists ----

def _go_sources(root):
    """The files of the Go module a wheel is built from (relative to root):
    go.mod, go.sum, LICENSE and the source files of every package of the
    module the library and the command depend on."""
    tag, goos, goarch = _platform()
    fields = "Dir,Module,GoFiles,CgoFiles,CFiles,CXXFiles,HFiles,SFiles,SysoFiles,EmbedFiles"
    out = _go(["list", "-deps", "-json=" + fields, GO_LIBRARY_PACKAGE, GO_COMMAND_PACKAGE], root, goos, goarch)
    files = {"go.mod", "go.sum", "LICENSE"}
    decoder, text, pos = json.JSONDecoder(), out.decode(), 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        pkg, pos = decoder.raw_decode(text, pos)
        if not (pkg.get("Module") or {}).get("Main"):
            continue  # the standard library, or a module go.sum pins
        rel = os.path.relpath(pkg["Dir"], root)
        for key in fields.split(",")[2:]:
            for name in pkg.get(key) or []:
                files.add(os.path.normpath(os.path.join(rel, name)).replace(os.sep, "/"))
    missing = sorted(f for f in files if not os.path.isfile(os.path.join(root, f)))
    if missing:
        raise BuildError("the Go sources listed by `go list` are missing: %s" % ", ".join(missing))
    return sorted(files)


def build_sdist(sdist_directory, config_settings=None):
    """A source archive that builds without the checkout: this package's
    sources and, in go/, the Go module's sources the wheel needs (its
    dependencies come through Go's module proxy when the wheel is built)."""
    project = _project()
    root = _go_root()
    base, _, _ = _names(project)
    entries = [("pyproject.toml", os.path.join(PACKAGE_ROOT, "pyproject.toml")),
               ("backend/gorovod_build.py", os.path.abspath(__file__))]
    entries += _package_files()
    entries += [("%s/%s" % (SDIST_GO_DIR, rel), os.path.join(root, rel)) for rel in _go_sources(root)]
    name = base + ".tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    tmp = os.path.join(sdist_directory, ".%s.%d.tmp" % (name, os.getpid()))
    mtime = _timestamp()

    def add(tar, arcname, data):
        info = tarfile.TarInfo("%s/%s" % (base, arcname))
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        tar.addfile(info, io.BytesIO(data))

    try:
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for arcname, path in entries:
                add(tar, arcname, _read(path))
            add(tar, "PKG-INFO", _metadata(project).encode())
        os.replace(tmp, os.path.join(sdist_directory, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return name
