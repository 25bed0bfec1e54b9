"""How much of the gradient exchange a training step hides behind the
backward pass, for train_bench.py's MLP (about 10 M parameters) on the CPU,
with DistributedOptimizer (--backend gorovod) or DistributedDataParallel on
torch.distributed's backend "gorovod" (--backend ddp-gorovod) or "gloo"
(--backend ddp-gloo, for comparison). Run it under `gorovod run` (for Gloo
too: inside a gorovod job gorovod.torch.distributed answers torch's env://
rendezvous):

    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/overlap.py --backend gorovod
    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/overlap.py --backend ddp-gorovod
    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/overlap.py --backend ddp-gloo

In the same processes, interleaved block by block (--repeats blocks of
--steps steps each, medians over the blocks), three times per step:

- compute: zero_grad, forward, backward and the SGD update with no exchange
  at all (the plain optimizer, the plain module), every rank at once, so on
  the same cores under the same contention as a real step;
- exchange: the same gradient buckets reduced in the same order, with no
  backward pass (gorovod: the optimizer's synchronize(), which starts every
  bucket and waits; DDP: buckets of the sizes DDP handed over in the last
  step, each all_reduce'd asynchronously in DDP's order, then waited for and
  divided by the world size);
- step: the whole data-parallel step.

hidden = (compute + exchange - step) / exchange: 1 when the exchange is
entirely hidden behind backward, 0 when the step costs compute plus
exchange (nothing overlapped). Compute varies from block to block by more
than the whole exchange on a loaded machine, so the step also times what
the exchange adds to it directly, the exposed wait: the time from the end
of backward's compute, every bucket handed over, until the last bucket is
reduced. With gorovod, the time in synchronize() after backward returned
(it starts the buckets backward has not started and waits for them all);
with DDP, from the return of the last bucket's all_reduce call (in DDP's
comm hook, torch's allreduce_hook timed) until the last bucket's future
completed (the hook's callback, which runs before DDP's wait for it
returns). DDP's copies of the reduced buckets into the gradients, which
follow in backward(), are not the exchange and are not counted (they are
in the step times). A rank that finishes backward before another also
waits for that one, which is the ranks' skew, not the exchange; so each
step's exposed wait is the least of the ranks' (that of the rank that
finished backward last). 1 - exposed / exchange is the hidden share
measured that way. A bucket that backward completes only at its end (DDP's
bucket of the first layer's gradients) can never be hidden, so the most a
bucket layout allows is the share of the other buckets.

--alone-compute times the compute step in a world of one instead (run the
script without `gorovod run`): the time on an unshared core, for
comparison.

Rank 0 prints the medians (with min and max over the blocks) and both
hidden shares as one RESULT line.
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    """train_bench.py's MLP: about 10 M parameters (40 MB of float32
    gradients), little compute."""
    return nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10), nn.LogSoftmax(dim=1))


def build(batch):
    torch.manual_seed(0)
    return mlp(), torch.randn(batch, 784), torch.randint(0, 10, (batch,))


def timed(fn, steps, barrier):
    """Seconds per call of fn over steps calls, every rank starting
    together."""
    barrier()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    barrier()
    return (time.perf_counter() - start) / steps


class Gorovod(object):
    """DistributedOptimizer's step, and its buckets reduced alone."""

    def __init__(self, batch):
        import gorovod.torch as hvd
        self.hvd = hvd
        hvd.init()
        self.model, self.x, self.y = build(batch)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.plain = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        # A second SGD over the same parameters for the data-parallel step
        # (DistributedOptimizer shares its parameter groups).
        inner = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.dist = hvd.DistributedOptimizer(inner, named_parameters=self.model.named_parameters())
        self.rank, self.size, self.barrier = hvd.rank(), hvd.size(), hvd.barrier
        self.waits = []

    def describe(self):
        return "%d buckets" % len(self.dist._order)

    def compute(self):
        self.plain.zero_grad()
        with self._no_exchange():
            F.nll_loss(self.model(self.x), self.y).backward()
        self.plain.step()

    def _no_exchange(self):
        """DistributedOptimizer's hooks, registered on the same parameters,
        counting nothing for one backward pass: a compute-only pass starts
        no allreduce."""
        opt = self.dist

        class Quiet(object):
            def __enter__(self):
                # never reaches 0 in one pass
                opt._allreduce_delay[:] = [1 << 30] * len(opt._allreduce_delay)
                return self

            def __exit__(self, *exc):
                opt._reset_step()
                return False

        return Quiet()

    def exchange(self):
        # The gradients the last backward left; synchronize() starts every
        # bucket in the fixed order and waits for them all.
        self.dist.synchronize()
        self.dist._synchronized = False  # the next step() synchronizes as usual

    def step(self):
        self.dist.zero_grad()
        F.nll_loss(self.model(self.x), self.y).backward()
        # What the exchange costs the step beyond backward: synchronize()
        # starts what backward has not started yet and waits for it all.
        began = time.perf_counter()
        self.dist.synchronize()
        self.waits.append(time.perf_counter() - began)
        with self.dist.skip_synchronize():
            self.dist.step()

    def gather(self, t):
        return self.hvd.allgather(t)

    def close(self):
        self.hvd.shutdown()


class DDP(object):
    """DistributedDataParallel (with bucket_cap_mb, torch's default 25) on a
    torch.distributed backend, "gorovod" or "gloo" (under `gorovod run`
    either way: inside a gorovod job gorovod.torch.distributed answers the
    env:// rendezvous, for Gloo too), and its buckets reduced alone."""

    def __init__(self, batch, backend, bucket_cap_mb):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        import gorovod.torch.distributed  # noqa: F401 (the backend, and the env:// rendezvous)
        if backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.dist_mod = dist
        dist.init_process_group(backend)
        self.model, self.x, self.y = build(batch)
        self.ddp = DistributedDataParallel(self.model, bucket_cap_mb=bucket_cap_mb)
        self.sizes = []  # the elements of each bucket of the last step, in DDP's order
        self.buffers = None  # buckets of those sizes, for the exchange alone
        self.submitted = self.reduced = 0.0
        n = dist.get_world_size()

        def allreduce_hook(state, bucket):
            # torch's default_hooks.allreduce_hook (what DDP does without a
            # hook), timed: when the bucket was handed to the backend, and
            # when its reduction came back (the callback runs on the thread
            # that completes the future, before DDP's wait for it returns).
            buf = bucket.buffer()
            self.sizes.append(buf.numel())
            fut = dist.all_reduce(buf.div_(n), async_op=True).get_future()
            self.submitted = time.perf_counter()

            def done(f):
                self.reduced = max(self.reduced, time.perf_counter())
                return f.value()[0]

            return fut.then(done)

        self.ddp.register_comm_hook(None, allreduce_hook)
        self.plain = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01, momentum=0.9)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.barrier = dist.barrier
        self.waits = []

    def describe(self):
        return "%d buckets of %s MB" % (len(self.sizes), "+".join("%.1f" % (k * 4 / 1e6) for k in self.sizes))

    def compute(self):
        self.plain.zero_grad()
        F.nll_loss(self.model(self.x), self.y).backward()
        self.plain.step()

    def exchange(self):
        # Buckets of the last step's sizes, reduced and divided as the hook
        # does (all ones, so that the values stay the same step after step).
        if self.buffers is None or [b.numel() for b in self.buffers] != self.sizes:
            self.buffers = [torch.ones(k) for k in self.sizes]
        n = self.size
        works = [self.dist_mod.all_reduce(b, async_op=True) for b in self.buffers]
        for b, w in zip(self.buffers, works):
            w.wait()
            b.div_(n)

    def step(self):
        self.sizes = []
        self.reduced = 0.0
        self.opt.zero_grad()
        F.nll_loss(self.ddp(self.x), self.y).backward()
        # What the exchange costs the step beyond backward: from the moment
        # backward handed DDP's last bucket to the backend (its compute
        # done) until the last bucket's reduction came back. DDP's copies of
        # the reduced buckets into the gradients follow inside backward(),
        # on every backend: they are not the exchange's (the step times
        # count them).
        self.waits.append(max(0.0, self.reduced - self.submitted))
        self.opt.step()

    def gather(self, t):
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self.dist_mod.all_gather(parts, t)
        return torch.cat(parts)

    def close(self):
        self.dist_mod.destroy_process_group()


def alone_compute(args):
    torch.set_num_threads(1)
    model, x, y = build(args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    samples = [timed(step, args.steps, lambda: None) for _ in range(args.repeats)]
    print("RESULT alone compute median %.2f ms min %.2f max %.2f" % (
        statistics.median(samples) * 1e3, min(samples) * 1e3, max(samples) * 1e3), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["gorovod", "ddp-gorovod", "ddp-gloo"], default="gorovod")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--repeats", type=int, default=5, help="blocks of each kind, interleaved")
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's bucket_cap_mb (torch's default 25)")
    p.add_argument("--alone-compute", action="store_true", help="time the compute step alone, no gorovod")
    args = p.parse_args()
    if args.alone_compute:
        alone_compute(args)
        return
    torch.set_num_threads(1)
    if args.backend == "gorovod":
        bench = Gorovod(args.batch_size)
    else:
        bench = DDP(args.batch_size, args.backend[len("ddp-"):], args.bucket_cap_mb)
    for _ in range(args.warmup):
        bench.step()
        bench.compute()
    times = {"compute": [], "exchange": [], "step": []}
    waits = []  # this rank's exposed wait in each step of the step blocks
    for r in range(args.repeats):
        # The order of the three rotates between blocks, so that none always
        # runs right after another.
        kinds = ["compute", "exchange", "step"]
        kinds = kinds[r % 3:] + kinds[:r % 3]
        for kind in kinds:
            bench.waits = []
            if kind == "exchange":
                bench.step()  # gradients (and DDP's buckets) of a real step to exchange
                bench.waits = []
            times[kind].append(timed(getattr(bench, kind), args.steps, bench.barrier))
            if kind == "step":
                waits.append(bench.waits)
    # A rank that finishes backward before another waits for that one too,
    # which is the ranks' skew, not the exchange: the rank that finished
    # backward last waits least, and only for what the exchange had left.
    every = bench.gather(torch.tensor(waits, dtype=torch.float64).reshape(1, -1))
    least = every.min(dim=0).values.reshape(len(waits), -1)
    times["exposed"] = least.mean(dim=1).tolist()
    med = {k: statistics.median(v) for k, v in times.items()}
    hidden = (med["compute"] + med["exchange"] - med["step"]) / med["exchange"]
    if bench.rank == 0:
        def show(k):
            return "%s %.2f ms [%.2f, %.2f]" % (k, med[k] * 1e3, min(times[k]) * 1e3, max(times[k]) * 1e3)

        print("RESULT %s np %d (%s): %s, %s, %s, %s; hidden %.2f by the step times, %.2f by the exposed wait" % (
            args.backend, bench.size, bench.describe(), show("compute"), show("exchange"), show("step"),
            show("exposed"), hidden, 1 - med["exposed"] / med["exchange"]), flush=True)
    bench.close()


if __name__ == "__main__":
    main()
