"""The Python side of the CUDA device path (gorovod._core's device= on every
collective, which gorovod.torch passes for CUDA tensors), against a library
built with -tags gorovod_cudastandin: its "device 0" is host memory that the
collectives reach only through their device-memory interface, and an event
is the address of an int32 flag (bindings/c/cudastandin.go). So the tensors
here are CPU tensors whose addresses go through the device path, and each
event is a ctypes flag the test sets. gorovod.torch's own step, recording a
torch.cuda.Event, needs a GPU (gpu_cuda_tensors.py).

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import ctypes
import sys
import time

import torch

import gorovod.torch as hvd
from gorovod import _core


# The stand-in's device address of host memory (cudastandin.go's
# standInOffset): a call that took it for host memory would fault.
OFFSET = 1 << 56


def dev(t):
    return t.data_ptr() + OFFSET


def device(flag=None):
    """The device marking of a call: device 0, after flag (None: at once);
    the flag stays alive with the call, as a torch.cuda.Event does."""
    return _core.CudaMemory(0, ctypes.addressof(flag) if flag is not None else 0, flag)


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    assert hvd.cuda_built() is True, "the stand-in library says it has no CUDA support"
    ramp = torch.arange(1000, dtype=torch.float32)
    summed = ramp * n + n * (n - 1) / 2

    # An asynchronous allreduce waits for its event before it reads the
    # tensor, which is written after the call was made.
    flag = ctypes.c_int32(0)
    x = torch.full((1000,), -1000.0)
    h = _core.allreduce_async(dev(x), dev(x), 1000, _core.FLOAT32, _core.SUM, 1.0, 1.0, x,
                              device=device(flag))
    time.sleep(0.05)  # time in which a call that ignored its event would finish
    assert not _core.poll(h), "the allreduce completed before its event passed"
    x.copy_(ramp + r)
    flag.value = 1
    _core.wait(h)
    assert torch.equal(x, summed), x[:4]

    # The synchronous forms (the _start calls), the shaped grouped form,
    # and one on a process set's path (the world's id is 0: the plain call).
    y = ramp + r
    _core.allreduce(dev(y), dev(y), 1000, _core.FLOAT32, _core.SUM, 1.0, 1.0, y, device=device())
    assert torch.equal(y, summed), y[:4]
    a, b = torch.tensor([float(r), 1.0]), torch.tensor([[2.0 * r, 4.0]], dtype=torch.float64)
    ao, bo = torch.zeros(2), torch.zeros(1, 2, dtype=torch.float64)
    _core.grouped_allreduce([dev(a), dev(b)], [dev(ao), dev(bo)], [2, 2],
                            [_core.FLOAT32, _core.FLOAT64], _core.AVERAGE, 1.0, 1.0, (a, b, ao, bo),
                            shapes=[(2,), (1, 2)], device=device())
    mean = (n - 1) / 2
    assert ao.tolist() == [mean, 1.0] and bo.tolist() == [[2 * mean, 4.0]], (ao, bo)
    flag = ctypes.c_int32(1)
    c = ramp + r
    h = _core.grouped_allreduce_async(None, [dev(c)], [1000], [_core.FLOAT32], _core.SUM, 1.0, 1.0, c,
                                      device=device(flag))
    _core.wait(h)
    assert torch.equal(c, summed), c[:4]

    # Broadcast, synchronous and asynchronous.
    v = torch.tensor([10 * r, r], dtype=torch.int64)
    _core.broadcast([dev(v)], [2], [_core.INT64], n - 1, v, device=device())
    assert v.tolist() == [10 * (n - 1), n - 1], v
    w = torch.tensor([float(r)])
    _core.wait(_core.broadcast_async([dev(w)], [1], [_core.FLOAT32], 0, w, device=device()))
    assert w.item() == 0.0, w

    # Allgather (rank q sends q+1 elements), alltoall, reducescatter.
    mine = torch.full((r + 1,), float(r))
    counts = [q + 1 for q in range(n)]
    every = torch.empty(sum(counts))
    _core.wait(_core.allgather_async(dev(mine), r + 1, dev(every), counts, _core.FLOAT32, (mine, every),
                                     device=device()))
    assert every.tolist() == [float(q) for q in range(n) for _ in range(q + 1)], every
    out = torch.tensor([float(100 * r + j) for j in range(n)])
    into = torch.empty(n)
    ones = [1] * n
    _core.wait(_core.alltoall_async(dev(out), ones, dev(into), ones, _core.FLOAT32, (out, into),
                                    device=device()))
    assert into.tolist() == [float(100 * j + r) for j in range(n)], into
    rs = torch.tensor([float(j + r) for j in range(n)])
    share = torch.empty(1)
    _core.wait(_core.reducescatter_async(dev(rs), n, dev(share), ones, _core.FLOAT32, _core.SUM, 1.0, 1.0,
                                         (rs, share), device=device()))
    assert share.item() == n * r + n * (n - 1) / 2, share

    # A host call after the device calls.
    z = torch.ones(3)
    hvd.allreduce_(z, op=hvd.Sum)
    assert torch.equal(z, torch.full((3,), float(n))), z
    print("PASS rank %d of %d" % (r, n), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
