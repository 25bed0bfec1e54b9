#!/usr/bin/env python3
"""PyTorch baselines for gorovod's CUDA backend, run by bench/gpu/run.sh on the
lent GPU machine. Writes JSON lines (one object per line, flushed as it goes):

  {"kind": "env", ...}        torch, CUDA, device name and capability
  {"kind": "copy", ...}       device-to-device copy (dst.copy_(src)) on the GPU,
                              timed with CUDA events
  {"kind": "allreduce", ...}  torch.distributed all_reduce (SUM) with backend
                              Gloo on CUDA tensors, 2 processes sharing the one
                              GPU (torch.multiprocessing spawn), wall clock with
                              torch.cuda.synchronize() around each call
  {"kind": "error", ...}      a size or part that failed (the rest goes on)
  {"kind": "stopped", ...}    the time budget ran out before the sizes did
  {"kind": "done", ...}       the end, with the seconds used

Sizes are 4 KiB to 256 MiB in powers of 4 (bytes of the tensor), for float32
and bfloat16; each is the median of a few timed iterations after a warm-up.
Bandwidths are in GB/s (10^9 bytes): algbw = bytes / time; for the copy also
membw = 2 * bytes / time (read and write); for the allreduce also busbw =
algbw * 2 * (n - 1) / n, as nccl-tests reports it.

The whole script stops on its own after --budget seconds (default 120): no new
size is started after the deadline and the workers are ended shortly after it.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

KIB = 1024
MIB = 1024 * KIB
SIZES = [4 * KIB * 4**i for i in range(9)]  # 4 KiB, 16 KiB, ..., 256 MiB
DTYPES = ["float32", "bfloat16"]
WORLD = 2


def emit(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()


def iters_for(nbytes, many, few):
    return many if nbytes <= 4 * MIB else few


def copy_bandwidth(torch, out, deadline, device, sizes):
    for dt in DTYPES:
        dtype = getattr(torch, dt)
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in sizes:
            if time.time() > deadline:
                emit(out, {"kind": "stopped", "part": "copy", "dtype": dt, "bytes": nbytes})
                return False
            try:
                n = nbytes // esize
                src = torch.ones(n, dtype=dtype, device=device)
                dst = torch.empty_like(src)
                iters = iters_for(nbytes, 20, 10)
                for _ in range(3):
                    dst.copy_(src)
                torch.cuda.synchronize(device)
                times = []
                for _ in range(iters):
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    dst.copy_(src)
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) / 1e3)
                t = statistics.median(times)
                emit(out, {"kind": "copy", "dtype": dt, "bytes": nbytes, "count": n, "iters": iters,
                           "median_s": t, "min_s": min(times),
                           "algbw_GBps": nbytes / t / 1e9, "membw_GBps": 2 * nbytes / t / 1e9})
                del src, dst
            except Exception as e:  # record and go on
                emit(out, {"kind": "error", "part": "copy", "dtype": dt, "bytes": nbytes, "error": repr(e)})
    torch.cuda.empty_cache()
    return True


def allreduce_worker(rank, out, deadline, store_path, device_index, world, sizes):
    import torch
    import torch.distributed as dist

    if device_index is None:  # --cpu: checks this script on a machine without a GPU
        device = torch.device("cpu")

        def sync():
            pass
    else:
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)

        def sync():
            torch.cuda.synchronize(device)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for dt in DTYPES:
            dtype = getattr(torch, dt)
            esize = torch.tensor([], dtype=dtype).element_size()
            for nbytes in sizes:
                # Rank 0 decides whether there is time for this size; all ranks follow.
                go = torch.tensor([1 if time.time() < deadline else 0], dtype=torch.int32)
                dist.broadcast(go, 0)
                if go.item() == 0:
                    if rank == 0:
                        emit(out, {"kind": "stopped", "part": "allreduce", "dtype": dt, "bytes": nbytes})
                    return
                n = nbytes // esize
                iters = iters_for(nbytes, 10, 5)
                err = None
                times = []
                try:
                    x = torch.ones(n, dtype=dtype, device=device)
                    dist.all_reduce(x)  # warm-up (also checks the sum below)
                    sync()
                    ok = bool((x == world).all().item())
                    for _ in range(iters):
                        dist.barrier()
                        sync()
                        t0 = time.perf_counter()
                        dist.all_reduce(x)
                        sync()
                        times.append(time.perf_counter() - t0)
                    del x
                except Exception as e:
                    err = repr(e)
                if rank == 0:
                    if err is not None:
                        emit(out, {"kind": "error", "part": "allreduce", "backend": "gloo", "dtype": dt,
                                   "bytes": nbytes, "error": err})
                    else:
                        t = statistics.median(times)
                        alg = nbytes / t / 1e9
                        emit(out, {"kind": "allreduce", "backend": "gloo", "tensor": device.type, "world": world,
                                   "dtype": dt, "bytes": nbytes, "count": n, "iters": iters, "op": "sum",
                                   "median_s": t, "min_s": min(times), "algbw_GBps": alg,
                                   "busbw_GBps": alg * 2 * (world - 1) / world, "warmup_sum_ok": ok})
                if err is not None:
                    # An error on one rank can leave the other waiting in a collective;
                    # stop this part rather than risk a hang.
                    return
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def allreduce_gloo(out, deadline, device_index, sizes):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        ctx = mp.spawn(allreduce_worker, args=(out, deadline, store, device_index, WORLD, sizes),
                       nprocs=WORLD, join=False)
        hard = deadline + 20  # a size started just before the deadline may finish after it
        try:
            while not ctx.join(timeout=1):
                if time.time() > hard:
                    emit(out, {"kind": "error", "part": "allreduce",
                               "error": "workers still running %.0f s after the deadline; terminated" % (hard - deadline)})
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    for p in ctx.processes:
                        p.join(5)
                        if p.is_alive():
                            p.kill()
                    return
        except Exception as e:  # a worker failed: ProcessRaisedException / ProcessExitedException
            emit(out, {"kind": "error", "part": "allreduce", "error": repr(e)[:2000]})
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON lines file (appended to)")
    ap.add_argument("--budget", type=float, default=120, help="seconds for the whole script (default 120)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest size (default 256 MiB)")
    ap.add_argument("--cpu", action="store_true",
                    help="only the Gloo allreduce, on CPU tensors: checks this script where there is no GPU")
    args = ap.parse_args()
    sizes = [b for b in SIZES if b <= args.max_bytes]
    start = time.time()
    deadline = start + max(args.budget, 1) - 5  # leave a little for the workers' exit

    try:
        import torch
    except Exception as e:
        emit(args.out, {"kind": "error", "part": "import", "error": repr(e)})
        return 2
    if args.cpu:
        emit(args.out, {"kind": "env", "torch": torch.__version__, "python": sys.version.split()[0],
                        "device": "cpu", "budget_s": args.budget})
        allreduce_gloo(args.out, deadline, None, sizes)
        emit(args.out, {"kind": "done", "seconds": round(time.time() - start, 1)})
        return 0
    if not torch.cuda.is_available():
        emit(args.out, {"kind": "skipped", "reason": "no GPU (torch.cuda.is_available() is False)",
                        "torch": torch.__version__})
        return 0
    dev = torch.device("cuda", args.device)
    props = torch.cuda.get_device_properties(dev)
    emit(args.out, {"kind": "env", "torch": torch.__version__, "cuda": torch.version.cuda,
                    "python": sys.version.split()[0], "device": props.name,
                    "capability": "%d.%d" % (props.major, props.minor),
                    "multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory,
                    "gloo": torch.distributed.is_available() and torch.distributed.is_gloo_available(),
                    "budget_s": args.budget})

    # The copy goes first (seconds); the Gloo allreduce gets the rest of the budget.
    try:
        copy_bandwidth(torch, args.out, deadline, dev, sizes)
    except Exception as e:
        emit(args.out, {"kind": "error", "part": "copy", "error": repr(e)})
    if time.time() < deadline:
        try:
            allreduce_gloo(args.out, deadline, args.device, sizes)
        except Exception as e:
            emit(args.out, {"kind": "error", "part": "allreduce", "error": repr(e)})
    emit(args.out, {"kind": "done", "seconds": round(time.time() - start, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
