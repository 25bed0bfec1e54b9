"""Runs tests of Horovod's own test/parallel/test_torch.py against gorovod.

    python3 horovod_torch_suite.py <horovod checkout> <test name>...

Horovod's file is read from the checkout, its one line ``import
horovod.torch as hvd`` becomes ``import gorovod.torch as hvd``, and it runs
unchanged otherwise. The two modules it imports that are not part of
gorovod get small stand-ins here: ``common`` (Horovod's test helpers: the
rank and size that mpirun would have put in the environment come from
gorovod, a GPU test skips, temppath makes a temporary file name), and
``pytest`` (only ``pytest.mark.skip`` is used). Nothing of Horovod's is
copied into this repository.

Each named test runs in this process; each rank prints one line per test,
"RESULT rank R test NAME: pass|fail|error|skip", then the failure's
traceback. The exit status is 0 when every test passed or skipped.
Driven by bindings/python/upstream_test.go (TestUpstreamTorchSuite), which
runs each test alone in a job of two workers.
"""

import contextlib
import os
import sys
import tempfile
import types
import unittest

import gorovod.torch as gorovod_hvd

IMPORT_LINE = "import horovod.torch as hvd"


def _common_module():
    common = types.ModuleType("common")

    def mpi_env_rank_and_size():
        # What mpirun's environment tells Horovod's tests, gorovod's
        # launcher tells the library: ask it.
        gorovod_hvd.init()
        return gorovod_hvd.rank(), gorovod_hvd.size()

    def skip_or_fail_gpu_test(test, message):
        test.skipTest(message)

    @contextlib.contextmanager
    def temppath():
        fd, path = tempfile.mkstemp()
        os.close(fd)
        try:
            yield path
        finally:
            if os.path.exists(path):
                os.remove(path)

    common.mpi_env_rank_and_size = mpi_env_rank_and_size
    common.skip_or_fail_gpu_test = skip_or_fail_gpu_test
    common.temppath = temppath
    return common


def _pytest_module():
    pytest = types.ModuleType("pytest")

    class Mark(object):
        @staticmethod
        def skip(reason=""):
            return unittest.skip(reason)

    pytest.mark = Mark()
    return pytest


def load(checkout):
    """Horovod's test_torch.py as a module, with its import line changed."""
    path = os.path.join(checkout, "test", "parallel", "test_torch.py")
    with open(path) as f:
        lines = f.read().split("\n")
    found = [i for i, line in enumerate(lines) if line == IMPORT_LINE]
    if len(found) != 1:
        raise SystemExit("%s: want the line %r once, found it %d times" % (path, IMPORT_LINE, len(found)))
    lines[found[0]] = "import gorovod.torch as hvd"
    sys.modules.setdefault("common", _common_module())
    sys.modules.setdefault("pytest", _pytest_module())
    module = types.ModuleType("test_torch")
    module.__file__ = path
    exec(compile("\n".join(lines), path, "exec"), module.__dict__)
    return module


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes.append((test, "pass", ""))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes.append((test, "fail", self.failures[-1][1]))

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes.append((test, "error", self.errors[-1][1]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes.append((test, "skip", reason))


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    module = load(sys.argv[1])
    gorovod_hvd.init()
    me = gorovod_hvd.rank()
    suite = unittest.TestSuite(module.TorchTests(name) for name in sys.argv[2:])
    result = _Result()
    suite.run(result)
    ok = True
    for test, outcome, detail in result.outcomes:
        print("RESULT rank %d test %s: %s" % (me, test._testMethodName, outcome), flush=True)
        if outcome in ("fail", "error"):
            ok = False
            print(detail, flush=True)
        elif outcome == "skip":
            print("  skipped: %s" % detail, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
