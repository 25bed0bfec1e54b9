"""What gorovod.torch's DistributedOptimizer costs a small model in CPU time,
under `gorovod run` (rank 0 prints):

- call: one grouped_allreduce_async_ of train_bench.py's CNN's 8 gradient
  shapes (its one bucket) and its synchronize, back to back: the calling
  thread's CPU for the submission and for the wait (medians over calls), and
  the process's CPU per call (every thread's: the library's too).
- C call: the library call alone that the submission ends in
  (gorovod_grouped_allreduce_shaped_async, on C arrays built once), the
  calling thread's CPU (median over calls).
- step: the CNN's backward + step() with DistributedOptimizer and with the
  plain optimizer, in the same process, alternating blocks of steps: the
  training thread's CPU per step, the difference (what the binding adds on
  that thread), and the other threads' CPU per step (the library's).

CPU time rather than wall time, since the machine may be shared.

    gorovod run --np 2 --min-np 2 -- python3 bindings/python/bench/bucket_cost.py
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench  # noqa: E402

import gorovod.torch as hvd  # noqa: E402
from gorovod import _core  # noqa: E402


def calls(n):
    """(submit, wait: the thread's CPU, s; the process's CPU per call, s)."""
    model = train_bench.CNN()
    ts = [torch.zeros_like(p) for p in reversed(list(model.parameters()))]
    for _ in range(100):
        hvd.synchronize(hvd.grouped_allreduce_async_(ts))
    hvd.barrier()
    submit, wait = [], []
    cpu = time.process_time()
    for _ in range(n):
        a = time.thread_time()
        h = hvd.grouped_allreduce_async_(ts)
        b = time.thread_time()
        hvd.synchronize(h)
        submit.append(b - a)
        wait.append(time.thread_time() - b)
    per_call = (time.process_time() - cpu) / n
    hvd.barrier()
    return statistics.median(submit), statistics.median(wait), per_call


def c_calls(n):
    """The calling thread's CPU of the C call alone (median, s)."""
    ts = [torch.zeros_like(p) for p in reversed(list(train_bench.CNN().parameters()))]
    count, _, recv, counts, dtypes = _core._grouped_arrays(None, [t.data_ptr() for t in ts], [t.numel() for t in ts],
                                                           [_core.FLOAT32] * len(ts))
    ndims, dims = _core._shape_arrays([tuple(t.shape) for t in ts])
    lib, h = _core.lib(), ctypes.c_uint64()
    hvd.barrier()
    took = []
    for _ in range(n):
        a = time.thread_time()
        rc = lib.gorovod_grouped_allreduce_shaped_async(0, count, None, recv, counts, dtypes, ndims, dims, _core.SUM,
                                                        1.0, 1.0, ctypes.byref(h))
        took.append(time.thread_time() - a)
        _core._raise(rc)
        _core._raise(lib.gorovod_wait(h.value, -1))
    hvd.barrier()
    return statistics.median(took)


def steps(blocks, per_block):
    """Per block pair: (training thread per step with DistributedOptimizer,
    the same with the plain optimizer, other threads per step with
    DistributedOptimizer), s."""
    def make(dist):
        model, x, y = train_bench.build("cnn", 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if dist:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        return model, opt, x, y

    def block(setup):
        model, opt, x, y = setup
        mine = 0.0
        cpu, thread = time.process_time(), time.thread_time()
        for _ in range(per_block):
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            a = time.thread_time()
            loss.backward()
            opt.step()
            mine += time.thread_time() - a
        others = (time.process_time() - cpu) - (time.thread_time() - thread)
        return mine / per_block, others / per_block

    plain, dist = make(False), make(True)
    block(plain)
    block(dist)
    hvd.barrier()
    out = []
    for _ in range(blocks):
        p, _ = block(plain)
        d, others = block(dist)
        out.append((d, p, others))
    hvd.barrier()
    return out


def spread(xs, scale=1e6):
    xs = sorted(xs)
    return "%.1f (%.1f-%.1f)" % (statistics.median(xs) * scale, xs[0] * scale, xs[-1] * scale)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--steps", type=int, default=50, help="steps per block")
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    submit, wait, per_call = calls(args.calls)
    c_call = c_calls(args.calls)
    s = steps(args.blocks, args.steps)
    if hvd.rank() == 0:
        print("CALL np %d: submit %.1f us, wait %.1f us (calling thread, medians of %d); process %.1f us per call"
              % (hvd.size(), submit * 1e6, wait * 1e6, args.calls, per_call * 1e6))
        print("C CALL np %d: %.1f us (calling thread, median of %d)" % (hvd.size(), c_call * 1e6, args.calls))
        print("STEP np %d, ms per step, median (min-max) of %d blocks of %d: training thread %s with "
              "DistributedOptimizer, %s plain, difference %s; other threads %s" % (
                  hvd.size(), args.blocks, args.steps, spread([d for d, _, _ in s], 1e3),
                  spread([q for _, q, _ in s], 1e3), spread([d - q for d, q, _ in s], 1e3),
                  spread([o for _, _, o in s], 1e3)), flush=True)


if __name__ == "__main__":
    main()
