"""Runs one test of PyTorch's own distributed tests against the "gorovod"
backend.

    python3 torch_distributed_suite.py <test name>

The tests are those of the installed torch's
torch/testing/_internal/distributed/distributed_test.py (the class
DistributedTest._DistTestBase, which torch's test_distributed_spawn.py runs
for Gloo, NCCL and UCC). torch's harness spawns the workers itself and
rendezvouses through a file; here `gorovod run` starts them, so this script
does in each worker what the harness's TestDistBackend._run does in its
spawned process: it makes the test case, sets its rank, calls
init_process_group("gorovod") (the job gives the rank, size and store),
passes the harness's file barrier (TEMP_DIR, which the driver makes with
its "barrier" folder) and calls the test. BACKEND is "gorovod" (the tests
make their groups with it), but a test skips only where it skips for both
of torch's CPU backends, Gloo and MPI: the skip marks (unittest's, which
torch's runner honours before spawning) are those of copies of
distributed_test.py imported with BACKEND=gloo and BACKEND=mpi, so a test
torch marks for Gloo only (or for the backends that implement DDP or
subgroups, Gloo among them) runs here too, and so do the CPU all_to_all
tests torch marks for MPI only. The harness's skip exit codes (no CUDA, too
few GPUs) count as skips too. A parametrized test runs as the tests torch
instantiates of it, one after another in the job; the few tests that pick
CPU tensors by the backend's name see "gloo" there (CPU_BY_BACKEND_NAME).

torch's testing helpers import expecttest (a test dependency Debian does
not package); where it is missing, a stand-in with the two names they use
takes its place. Nothing of PyTorch's is copied into this repository.

Each rank prints "RESULT rank R test NAME: pass|fail|skip", then the
failure's traceback. Driven by bindings/python/upstream_test.go
(TestUpstreamTorchDistributedSuite).
"""

import os
import sys
import traceback
import types
import unittest
from datetime import timedelta

os.environ["BACKEND"] = "gorovod"
# Before torch's test modules are imported: they read WORLD_SIZE on import
# (require_world_size), which this import sets (it joins the job).
import gorovod.torch as gorovod_torch  # noqa: E402
import gorovod.torch.distributed  # noqa: E402,F401

import torch.distributed as dist  # noqa: E402

try:
    import expecttest  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("expecttest")
    stand_in.ACCEPT = False
    stand_in.TestCase = unittest.TestCase
    sys.modules["expecttest"] = stand_in

import importlib.util  # noqa: E402

from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.distributed import distributed_test as torch_tests  # noqa: E402


def marks_of(backend):
    """distributed_test.py's test class as it is for BACKEND=backend: its
    methods carry the skip marks of that backend's run of the file. The file
    reads BACKEND when it is imported, so this is another import of it under
    another name (every rank makes it, in the same order, so the module's
    randomly initialised models stay alike across ranks)."""
    spec = importlib.util.spec_from_file_location("gorovod_suite_%s_marks" % backend, torch_tests.__file__)
    module = importlib.util.module_from_spec(spec)
    os.environ["BACKEND"] = backend
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ["BACKEND"] = "gorovod"
    return module.DistributedTest._DistTestBase


CPU_BACKEND_MARKS = [marks_of("gloo"), marks_of("mpi")]


class TestDistBackendGorovod(torch_tests.TestDistBackend, torch_tests.DistributedTest._DistTestBase):
    pass


# Tests whose bodies choose their devices by the backend's name (CPU for
# "gloo" or "mpi", else nothing: the test then fails on a name it never
# set) and use the name for nothing else: they run with distributed_test's
# BACKEND reading "gloo" (their process group is still gorovod's).
CPU_BY_BACKEND_NAME = {
    "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
}


def variants(name):
    """The tests of the class for the name of a test method in the file:
    itself, or, for a parametrized one (@parametrize), the methods
    instantiate_parametrized_tests made of it (name_<parameters>)."""
    if hasattr(TestDistBackendGorovod, name):
        return [name]
    return sorted(a for a in dir(TestDistBackendGorovod) if a.startswith(name + "_"))


def run_all(name, rank):
    """The outcome of name's tests on this rank (fail when one fails, skip
    when all skip) and why."""
    outcomes, whys = [], []
    for test in variants(name) or [name]:
        outcome, why = run(test, rank)
        outcomes.append(outcome)
        if why:
            whys.append("%s: %s" % (test, why))
        if outcome == "fail":
            break
    for outcome in ("fail", "pass"):
        if outcome in outcomes:
            return outcome, "\n".join(whys)
    return "skip", "\n".join(whys)


def destroy():
    if dist.is_initialized():
        dist.destroy_process_group()


def run(name, rank):
    """name's outcome on this rank and, for a failure, why."""
    # A test the file defines only for some backends (torch 2.x defines a
    # few inside `if BACKEND == ...`) is not run for the others.
    marks = [getattr(cls, name, None) for cls in CPU_BACKEND_MARKS]
    if all(m is None or getattr(m, "__unittest_skip__", False) for m in marks):
        return "skip", "; ".join("not defined for %s" % b if m is None else getattr(m, "__unittest_skip_why__", "")
                                 for b, m in zip(("gloo", "mpi"), marks))
    skip_codes = {v.exit_code: k for k, v in TEST_SKIPS.items()}
    try:
        case = TestDistBackendGorovod(name)
        case.rank = rank
        case.file_name = os.path.join(os.environ["TEMP_DIR"], "init_file")
        seconds = torch_tests.CUSTOM_PG_TIMEOUT.get(name, torch_tests.default_pg_timeout)
        dist.init_process_group("gorovod", timeout=timedelta(seconds=seconds))
        case._barrier()
        torch_tests.BACKEND = "gloo" if name in CPU_BY_BACKEND_NAME else "gorovod"
        try:
            getattr(case, name)()
        finally:
            torch_tests.BACKEND = "gorovod"
        case._barrier()
        dist.destroy_process_group()
    except unittest.SkipTest as e:
        destroy()
        return "skip", str(e)
    except SystemExit as e:
        # The harness's decorators leave a process with an exit code that
        # says why it skipped.
        if e.code in (0, None):
            destroy()
            return "pass", ""
        if e.code in skip_codes:
            destroy()
            return "skip", skip_codes[e.code]
        return "fail", "exit status %r" % (e.code,)
    except Exception:  # noqa: BLE001 (reported)
        return "fail", traceback.format_exc()
    return "pass", ""


def main():
    name = sys.argv[1]
    rank = int(os.environ["RANK"])
    outcome, why = run_all(name, rank)
    print("RESULT rank %d test %s: %s" % (rank, name, outcome), flush=True)
    if why:
        print(why, flush=True)
    sys.stdout.flush()
    if outcome == "fail":
        # A failed test can leave a collective queued, which a clean exit
        # would wait for; the job fails with this worker.
        os._exit(1)
    # Tells the job that training is over, as a trainer's exit does: a
    # worker that left without saying so would be replaced (the job's
    # minimum), and the replacement would wait for a world alone.
    gorovod_torch.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
