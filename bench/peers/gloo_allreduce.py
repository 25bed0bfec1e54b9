#!/usr/bin/python3
"""PyTorch-Gloo allreduce benchmark, output-compatible with `gorovod bench`.

Spawns --np processes with torch.multiprocessing, joins them in a Gloo process
group over 127.0.0.1 and, for every message size, times float32 SUM
dist.all_reduce the way gorovod's collective/benchmark does. With --env-rank it
is instead one rank of a job started by someone else, on this host or across
hosts: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment
(init_method env://, the variables torchrun would set; rank 0 serves the store
at MASTER_ADDR:MASTER_PORT), and Gloo binds to GLOO_SOCKET_IFNAME's address
(internal/testing/multihostbench starts its ranks this way over ssh).

  * --warmup untimed runs, then --iters timed samples;
  * every sample starts with dist.barrier() and is timed on every rank;
  * a sample lasts as long as its slowest rank (MAX over ranks, gathered once
    at the end of the size with an allreduce of the per-rank time array);
  * the MEDIAN over samples is reported;
  * optional --batch-time-us B: if one op is shorter than B, a sample runs
    ceil(B/op) ops back to back (max 1000, agreed across ranks) and reports
    the per-op time -- the same rule gorovod uses (its default is 1000 us).
    Default here is 0: one op per sample.

Rank 0 prints one JSON object per size to stdout:
  {"impl":"gloo","op":"allreduce","np":N,"bytes":B,"time_us":T,
   "algbw_gbps":..,"busbw_gbps":..,"correct":true, ...}
algbw = bytes/time in GB/s (1e9 B/s); busbw = algbw*2*(np-1)/np.

Correctness: rank r's element i is (r+i)%4 (gorovod's pattern), so the sum is an
exact small integer; after timing, the buffer is refilled, reduced once more
and checked element-wise on every rank (MIN over ranks -> "correct").

Must run under Debian's /usr/bin/python3 (python3-torch); the pyenv python3 on
PATH has no torch.
"""
import argparse
import json
import math
import os
import socket
import statistics
import sys
import time


def parse_size(s):
    t = s.strip().upper()
    for suf in ("IB", "B"):
        if t.endswith(suf) and len(t) > len(suf):
            t = t[: -len(suf)]
            break
    mult = 1
    if t and t[-1] in "KMG":
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[t[-1]]
        t = t[:-1]
    n = int(t) * mult
    if n < 0:
        raise ValueError(s)
    return n


def size_list(args):
    if args.sizes:
        return [parse_size(x) for x in args.sizes.split(",") if x.strip()]
    lo, hi, f = parse_size(args.min_bytes), parse_size(args.max_bytes), max(2, args.factor)
    out, b = [], lo
    while b <= hi:
        out.append(b)
        if b == 0:
            break
        b *= f
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, init_method, args, sizes):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 cores shared by np processes: no intra-op pool
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=__import__("datetime").timedelta(seconds=args.timeout),
    )
    p = world
    factor = 2.0 * (p - 1) / p
    for size in sizes:
        n = size // 4
        nbytes = n * 4
        idx = torch.arange(n, dtype=torch.int32)  # int64 would double the peak at 256 MiB
        src = ((idx + rank) % 4).to(torch.float32)
        want = torch.zeros(n, dtype=torch.float32)
        for r in range(p):
            want += ((idx + r) % 4).to(torch.float32)
        del idx
        buf = src.clone()

        op = lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM)

        warm = 0.0
        for _ in range(max(1, args.warmup)):
            buf.copy_(src)
            t0 = time.perf_counter()
            op()
            warm = time.perf_counter() - t0
        batch = 1
        bt = args.batch_time_us * 1e-6
        if bt > 0 and 0 < warm < bt:
            batch = int(min(1000, bt // warm + 1))
        agreed = torch.tensor([batch], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        batch = int(agreed.item())

        samples = torch.zeros(args.iters, dtype=torch.float64)
        for i in range(args.iters):
            buf.copy_(src)  # untimed reset (in-place op); batched runs reuse the result
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(batch):
                op()
            samples[i] = (time.perf_counter() - t0) / batch
        dist.all_reduce(samples, op=dist.ReduceOp.MAX)

        buf.copy_(src)
        op()
        ok = torch.tensor([1 if torch.equal(buf, want) else 0], dtype=torch.int32)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)

        med = statistics.median(samples.tolist())
        algbw = nbytes / med / 1e9 if med > 0 else 0.0
        if math.isinf(algbw):
            algbw = 0.0
        if rank == 0:
            rec = {
                "impl": args.impl,
                "op": "allreduce",
                "np": p,
                "bytes": nbytes,
                "count": n,
                "dtype": "float32",
                "redop": "sum",
                "time_us": round(med * 1e6, 3),
                "algbw_gbps": round(algbw, 6),
                "busbw_gbps": round(algbw * factor, 6),
                "correct": bool(ok.item() == 1),
                "iters": args.iters,
                "batch": batch,
            }
            print(json.dumps(rec), flush=True)
        del buf, src, want
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--min-bytes", default="4K")
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--sizes", default="", help='explicit list, e.g. "4K,256K,4M,64M" (overrides min/max/factor)')
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--batch-time-us", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0, help="rendezvous port on 127.0.0.1 (0: pick a free one)")
    ap.add_argument("--timeout", type=int, default=600, help="process-group timeout in seconds")
    ap.add_argument("--impl", default="gloo", help='value of the "impl" field')
    ap.add_argument(
        "--env-rank",
        action="store_true",
        help="run one rank: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment (--np, --port ignored)",
    )
    args = ap.parse_args()
    if args.np < 1 or args.iters < 1 or args.warmup < 0:
        ap.error("need --np >= 1, --iters >= 1, --warmup >= 0")
    sizes = size_list(args)
    if not sizes:
        ap.error("no sizes")
    if args.env_rank:
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            ap.error("--env-rank needs %s in the environment" % ", ".join(missing))
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if not 0 <= rank < world:
            ap.error("RANK %d is not in [0, WORLD_SIZE %d)" % (rank, world))
        # No GLOO_SOCKET_IFNAME default here: the caller knows the host's interface.
        worker(rank, world, "env://", args, sizes)
        return 0
    # Without GLOO_SOCKET_IFNAME Gloo binds to whatever the hostname resolves to
    # (here "vm" -> 127.0.0.1, elsewhere possibly a real NIC, or failing). Pin
    # loopback so the transport matches mpi-tcp's btl_tcp_if_include=lo.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = args.port or free_port()

    # Plain multiprocessing (spawn) rather than torch.multiprocessing.spawn: the
    # parent then never imports torch (seconds saved per launch), and a rank that
    # dies takes the others down instead of leaving them blocked in Gloo.
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    init = "tcp://127.0.0.1:%d" % port
    procs = [ctx.Process(target=worker, args=(r, args.np, init, args, sizes), name="gloo-rank%d" % r) for r in range(args.np)]
    for pr in procs:
        pr.start()
    rc = 0
    alive = list(procs)
    while alive:
        for pr in list(alive):
            pr.join(timeout=0.2)
            if pr.exitcode is None:
                continue
            alive.remove(pr)
            if pr.exitcode != 0 and rc == 0:
                rc = 1
                print("gloo_allreduce: %s exited with %s; stopping the others" % (pr.name, pr.exitcode), file=sys.stderr)
                for other in alive:
                    other.terminate()
    return rc


if __name__ == "__main__":
    sys.exit(main())
