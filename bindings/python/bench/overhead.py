"""The binding's own cost: in-place allreduce of float32 tensors from
Python (gorovod.torch.allreduce_) at 1 K, 1 M and 16 M elements, median
seconds per call; compare with `gorovod bench allreduce` at the same byte
sizes (4K, 4M, 64M) on the same transport.

    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/overhead.py
"""

import statistics
import time

import torch

import gorovod.torch as hvd

hvd.init()
torch.set_num_threads(1)
for n, iters in ((1 << 10, 200), (1 << 20, 20), (1 << 24, 8)):
    t = torch.ones(n)
    for _ in range(3):
        hvd.allreduce_(t, op=hvd.Sum)
    samples = []
    for _ in range(iters):
        hvd.barrier()
        start = time.perf_counter()
        hvd.allreduce_(t, op=hvd.Sum)
        samples.append(time.perf_counter() - start)
    if hvd.rank() == 0:
        print("RESULT %d elements (%d bytes): median %.1f us, min %.1f us" % (
            n, 4 * n, statistics.median(samples) * 1e6, min(samples) * 1e6), flush=True)
hvd.shutdown()
