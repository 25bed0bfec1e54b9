"""When DistributedDataParallel's buckets are reduced on the "gorovod"
backend, against backward's progress: timestamps, per step, of each
parameter's gradient, of each bucket's all_reduce call (its return) and of
the completion of its work's future (what DDP's reducer waits on at the end
of backward), and of backward's start and end, for overlap.py's MLP
(torch's default bucket_cap_mb=25). Run it under `gorovod run`, then read
the files it wrote:

    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/ddp_trace.py --dir /tmp/trace
    /usr/bin/python3 bindings/python/bench/ddp_trace.py --analyze /tmp/trace

Each rank writes DIR/rank<r>.json (wall-clock times, time.time(), the
clock of gorovod's timeline: add `--timeline-filename` to `gorovod run` to
see the engine's collectives beside them). --analyze prints, for each
traced step, each rank's times from the start of its backward pass, and on
the rank that reached its last gradient (the first layer's weight) last,
how long before that gradient the first bucket's future was complete: a
bucket reduced while backward runs is complete before it, one reduced only
once backward ends after it.
"""

import argparse
import glob
import json
import os
import statistics
import threading
import time


def trace(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    import gorovod.torch.distributed as backend
    from overlap import build

    torch.set_num_threads(1)
    dist.init_process_group("gorovod")
    events = []
    step = {"n": -1}

    def record(name, **kw):
        events.append(dict(t=time.time(), thread=threading.current_thread().name, name=name, step=step["n"], **kw))

    original = backend.ProcessGroupGorovod._allreduce

    def allreduce(self, tensors, opts, what):
        n = sum(t.numel() for t in tensors)
        work = original(self, tensors, opts, what)
        work.get_future().add_done_callback(lambda f: record("future done", numel=n))
        record("allreduce returned", numel=n)
        return work

    backend.ProcessGroupGorovod._allreduce = allreduce
    model, x, y = build(args.batch_size)
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: record("grad", param=name))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    for s in range(args.warmup + args.steps):
        step["n"] = s - args.warmup  # negative: warm-up (DDP rebuilds its buckets after the first)
        dist.barrier()
        opt.zero_grad()
        loss = F.nll_loss(ddp(x), y)
        record("backward start")
        loss.backward()
        record("backward end")
        opt.step()
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "rank%d.json" % dist.get_rank()), "w") as f:
        json.dump(events, f)
    dist.destroy_process_group()


def analyze(directory):
    ranks = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        with open(path) as f:
            ranks[int(os.path.basename(path)[4:-5])] = [e for e in json.load(f) if e["step"] >= 0]
    ahead = []
    for s in sorted({e["step"] for e in ranks[0]}):
        last = {}
        for r, events in sorted(ranks.items()):
            ev = [e for e in events if e["step"] == s]
            t0 = next(e["t"] for e in ev if e["name"] == "backward start")
            submitted = [e for e in ev if e["name"] == "allreduce returned"]
            done = [e for e in ev if e["name"] == "future done"]
            grad = next(e["t"] for e in ev if e["name"] == "grad" and e["param"] == "0.weight")
            end = next(e["t"] for e in ev if e["name"] == "backward end")
            ms = lambda t: (t - t0) * 1e3  # noqa: E731
            print("step %d rank %d (ms from backward's start): %s; last gradient %.1f; %s; backward returned %.1f" % (
                s, r, "; ".join("bucket %d of %.1f MB submitted %.1f" % (k, e["numel"] * 4 / 1e6, ms(e["t"]))
                                for k, e in enumerate(submitted)),
                ms(grad), "; ".join("bucket %d's future complete %.1f" % (k, ms(e["t"])) for k, e in enumerate(done)),
                ms(end)))
            last[r] = (grad, done[0]["t"] if done else None)
        r = max(last, key=lambda q: last[q][0])
        grad, first = last[r]
        if first is not None:
            ahead.append((grad - first) * 1e3)
            print("step %d: on rank %d, the last to reach its last gradient, the first bucket's future was complete "
                  "%.1f ms before it" % (s, r, ahead[-1]))
    if ahead:
        print("first bucket complete before the last gradient (ms; negative: after): median %.1f, min %.1f, max %.1f "
              "over %d steps" % (statistics.median(ahead), min(ahead), max(ahead), len(ahead)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", help="where each rank writes its events")
    p.add_argument("--analyze", metavar="DIR", help="print the events the ranks wrote to DIR")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    if args.analyze:
        analyze(args.analyze)
    elif args.dir:
        trace(args)
    else:
        p.error("give --dir (under gorovod run) or --analyze")


if __name__ == "__main__":
    main()
