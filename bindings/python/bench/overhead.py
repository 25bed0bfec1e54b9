"""The binding's own cost: in-place Sum allreduce of float32 tensors from
Python (gorovod.torch.allreduce_) at 1 K, 1 M and 16 M elements, in two loop
shapes, against overhead/main.go, which makes the same calls in the same
shapes from Go through the engine the C ABI wraps:

- alone: one call timed after a barrier (median of many);
- back-to-back: a run of calls, each started when the previous one returned
  (median time per call over several runs).

    go build -o /tmp/overhead-go ./bindings/python/bench/overhead
    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/overhead.py
    gorovod run --np 2 --min-np 2 -- /tmp/overhead-go

Rank 0 prints one RESULT line per shape and size.
"""

import statistics
import time

import torch

import gorovod.torch as hvd

# (elements, calls timed alone, back-to-back runs, calls per run): as main.go.
SIZES = ((1 << 10, 200, 5, 200), (1 << 20, 20, 5, 10), (1 << 24, 8, 3, 3))


def report(shape, n, samples):
    print("RESULT python %s %d elements (%d bytes): median %.1f us, min %.1f us" % (
        shape, n, 4 * n, statistics.median_low(samples) * 1e6, min(samples) * 1e6), flush=True)


def main():
    hvd.init()
    torch.set_num_threads(1)
    for n, alone_calls, runs, per_run in SIZES:
        t = torch.ones(n)
        for _ in range(3):
            hvd.allreduce_(t, op=hvd.Sum)
        alone = []
        for _ in range(alone_calls):
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce_(t, op=hvd.Sum)
            alone.append(time.perf_counter() - start)
        b2b = []
        for _ in range(runs):
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(per_run):
                hvd.allreduce_(t, op=hvd.Sum)
            b2b.append((time.perf_counter() - start) / per_run)
        if hvd.rank() == 0:
            report("alone", n, alone)
            report("back-to-back", n, b2b)
    hvd.shutdown()


if __name__ == "__main__":
    main()
