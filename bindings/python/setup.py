"""Installs the gorovod Python package with libgorovod.so built from this
repository's Go sources:

    pip install --no-build-isolation ./bindings/python

The build step runs `go build -buildmode=c-shared` (Go must be on the PATH);
nothing is fetched from a package index: setuptools is Debian's
(python3-setuptools), and torch is only needed to use gorovod.torch.
"""

import importlib
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


class BuildWithLibrary(build_py):
    """build_py that also builds libgorovod.so into the package."""

    def run(self):
        super().run()
        if not os.path.isfile(os.path.join(ROOT, "go.mod")):
            raise RuntimeError("gorovod: setup.py must run inside the gorovod repository (bindings/python), "
                               "whose Go sources it builds")
        out = os.path.abspath(os.path.join(self.build_lib, "gorovod", "libgorovod.so"))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        core = _load_core()
        self.announce("building %s (go build -buildmode=c-shared)" % out, level=2)
        core.build_library(ROOT, out)


def _load_core():
    """gorovod._core from the source tree (its build_library is the one
    build command; it imports only the standard library and
    gorovod.exceptions)."""
    sys.path.insert(0, HERE)
    try:
        return importlib.import_module("gorovod._core")
    finally:
        sys.path.pop(0)


setup(
    name="gorovod",
    version="0.1.0",
    description="Elastic, Horovod-style collective communication for PyTorch (ctypes over libgorovod)",
    license="Apache-2.0",
    packages=["gorovod", "gorovod.torch", "gorovod.torch.elastic"],
    package_data={"gorovod": ["libgorovod.so"]},
    python_requires=">=3.8",
    cmdclass={"build_py": BuildWithLibrary},
    zip_safe=False,
)
