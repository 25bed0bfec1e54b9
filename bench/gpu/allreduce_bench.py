#!/usr/bin/env python3
"""gorovod.torch allreduce benchmark, the counterpart of torch_baseline.py's
Gloo allreduce: run under ``gorovod run --np 2`` (both workers on the one
GPU), each rank allreduces (Average, in place: ``hvd.allreduce_``) a CUDA
tensor of 4 KiB to 256 MiB (powers of 4), float32 and bfloat16; the median
of a few timed iterations after a warm-up, wall clock with
torch.cuda.synchronize() before the start and after the end of each call.

Rank 0 appends JSON lines to --out (one object per line, flushed as it goes),
with torch_baseline.py's field names so the two compare line by line:

  {"kind": "env", ...}        torch, CUDA, device, world size, gorovod's cuda_built()
  {"kind": "allreduce", ...}  backend "gorovod", path "device" (the CUDA tensor
                              handed to gorovod) or "host-staged" (copied to a
                              CPU tensor, allreduced, copied back: what a
                              script can do when the device path fails),
                              median_s, min_s, algbw_GBps, busbw_GBps
                              (algbw * 2 (n-1)/n), warmup_ok (the warm-up's
                              result is the average of the ranks' values)
  {"kind": "error", ...}      a size or path that failed, with the exception
  {"kind": "stopped", ...}    the time budget ran out before the sizes did
  {"kind": "done", ...}       the end, with the seconds used

When the device path fails on a dtype's first size (a library without the
CUDA path refuses CUDA tensors with ValueError), the error is recorded and
that dtype is measured on the host-staged path instead, so the run always
yields a gorovod figure. Every rank raises the same error there (the check
is local), so the ranks stay in step; after each size the ranks agree
(an allreduce of CPU flags) on whether to go on.

--cpu: CPU tensors and no CUDA at all, to check this script on a machine
without a GPU (path "cpu").

Usage: gorovod run --np 2 -- python3 bench/gpu/allreduce_bench.py --out FILE [--budget S]
"""

import argparse
import json
import os
import statistics
import sys
import time

KIB = 1024
MIB = 1024 * KIB
SIZES = [4 * KIB * 4**i for i in range(9)]  # 4 KiB, 16 KiB, ..., 256 MiB
DTYPES = ["float32", "bfloat16"]


class Emitter:
    def __init__(self, path, enabled):
        self.path, self.enabled = path, enabled

    def __call__(self, obj):
        if not self.enabled:
            return
        obj = dict(obj, source="allreduce_bench")
        with open(self.path, "a") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()


def iters_for(nbytes):
    if nbytes <= MIB:
        return 20
    if nbytes <= 16 * MIB:
        return 10
    return 5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON lines file (appended to by rank 0)")
    ap.add_argument("--budget", type=float, default=60, help="seconds for the whole run (default 60)")
    ap.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest size (default 256 MiB)")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated (default float32,bfloat16)")
    ap.add_argument("--path", choices=["auto", "device", "host-staged"], default="auto",
                    help="auto (default): the device path, the host-staged one where it fails")
    ap.add_argument("--cpu", action="store_true", help="CPU tensors: checks this script where there is no GPU")
    args = ap.parse_args()
    start = time.time()
    deadline = start + max(args.budget, 1) - 3
    sizes = [b for b in SIZES if b <= args.max_bytes]

    import torch
    import gorovod.torch as hvd

    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    emit = Emitter(args.out, rank == 0)
    if args.cpu:
        device = torch.device("cpu")

        def sync():
            pass
    else:
        if not torch.cuda.is_available():
            emit({"kind": "skipped", "reason": "no GPU (torch.cuda.is_available() is False)"})
            return 0
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())

        def sync():
            torch.cuda.synchronize(device)
    env = {"kind": "env", "torch": torch.__version__, "python": sys.version.split()[0], "world": world,
           "local_size": hvd.local_size(), "cuda_built": bool(hvd.cuda_built()), "device": str(device),
           "budget_s": args.budget}
    if not args.cpu:
        env.update(cuda=torch.version.cuda, device_name=torch.cuda.get_device_name(device))
    emit(env)

    def agree(ok):
        """True when every rank says ok (a CPU allreduce: works on any library)."""
        flag = torch.tensor([0 if ok else 1], dtype=torch.int32)
        return int(hvd.allreduce(flag, op=hvd.Sum, name="agree").item()) == 0

    def measure(dt, nbytes, path):
        dtype = getattr(torch, dt)
        n = nbytes // torch.tensor([], dtype=dtype).element_size()
        x = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
        host = torch.empty(n, dtype=dtype) if path == "host-staged" else None
        want = (world + 1) / 2.0  # the average of 1..world: exact in bfloat16 for 2 ranks
        name = "ar.%s.%d" % (dt, nbytes)

        def once():
            if host is None:
                hvd.allreduce_(x, op=hvd.Average, name=name)
            else:
                host.copy_(x)
                hvd.allreduce_(host, op=hvd.Average, name=name)
                x.copy_(host)

        once()  # warm-up, checked
        sync()
        ok = bool((x == want).all().item())
        once()
        sync()
        iters = iters_for(nbytes)
        times = []
        for _ in range(iters):
            hvd.barrier()
            sync()
            t0 = time.perf_counter()
            once()
            sync()
            times.append(time.perf_counter() - t0)
        # Rank 0's times; the slowest rank's median would be at most the other's plus the barrier skew.
        t = statistics.median(times)
        alg = nbytes / t / 1e9
        return {"kind": "allreduce", "backend": "gorovod", "path": path, "tensor": device.type, "world": world,
                "dtype": dt, "bytes": nbytes, "count": n, "iters": iters, "op": "average", "median_s": t,
                "min_s": min(times), "algbw_GBps": alg, "busbw_GBps": alg * 2 * (world - 1) / world,
                "warmup_ok": ok}

    for dt in args.dtypes.split(","):
        path = "cpu" if args.cpu else ("device" if args.path in ("auto", "device") else "host-staged")
        for i, nbytes in enumerate(sizes):
            go = torch.tensor([1 if time.time() < deadline else 0], dtype=torch.int32)
            hvd.broadcast_(go, 0, name="go")  # rank 0 decides; all follow
            if go.item() == 0:
                emit({"kind": "stopped", "dtype": dt, "bytes": nbytes})
                emit({"kind": "done", "seconds": round(time.time() - start, 1)})
                hvd.shutdown()
                return 0
            rec, err = None, None
            try:
                rec = measure(dt, nbytes, path)
            except Exception as e:  # recorded; the ranks agree below whether to go on
                err = repr(e)[:1000]
            if err is not None:
                emit({"kind": "error", "backend": "gorovod", "path": path, "dtype": dt, "bytes": nbytes,
                      "error": err})
            if not agree(err is None):
                if i == 0 and path == "device" and args.path == "auto":
                    # The device path failed at once (every rank: see the docstring): measure the staged one.
                    path = "host-staged"
                    try:
                        rec, err = measure(dt, nbytes, path), None
                    except Exception as e:
                        err = repr(e)[:1000]
                        emit({"kind": "error", "backend": "gorovod", "path": path, "dtype": dt, "bytes": nbytes,
                              "error": err})
                    if not agree(err is None):
                        break
                else:
                    break
            if rec is not None:
                emit(rec)
            if not args.cpu:
                torch.cuda.empty_cache()
    emit({"kind": "done", "seconds": round(time.time() - start, 1)})
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
