"""The gradient exchange overlaps the backward pass, for DistributedOptimizer
and for DistributedDataParallel on the "gorovod" backend: a bucket's
allreduce is started while backward goes on, and starting it does not wait
for it.

Shown without timing: rank 0 runs its whole backward pass while every other
rank waits, before its own backward pass, until rank 0 reaches its last
gradient (the first layer's weight; the other ranks poll for a file rank 0
writes then, with a deadline). Rank 0 gets there only if its allreduces,
which no other rank has joined yet, neither block in the thread that
started them nor are waited for during backward. By then rank 0 must have
started every bucket that holds no first-layer gradient (counted at the
calls DistributedOptimizer and the process group make into gorovod.torch),
and waited for none. Then the steps end on every rank with the same
parameters. For DistributedDataParallel, the first bucket is also reduced
while backward runs: every rank waits in its last gradient's hook, with a
deadline, for that bucket's future (check_ddp_reduced_in_backward).

OVERLAP_TEST_DIR names the directory of the files. Prints "PASS rank R of
N". Driven by bindings/python/python_test.go.
"""

import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gorovod.torch as hvd
from gorovod.torch import mpi_ops

# How long the other ranks wait for rank 0's backward pass: generous, for an
# overloaded machine; rank 0's pass takes milliseconds on an idle one.
GATE_SECONDS = 120


def model_fn():
    # Two weights of 1 MiB, each a bucket of its own in DistributedOptimizer
    # (see optimizer._ALONE_BYTES); the small parameters share one bucket.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512),
                         nn.ReLU(), nn.Linear(512, 8))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 64, generator=g), torch.randint(0, 8, (16,), generator=g)


class Counted(object):
    """Counts the calls of mpi_ops' function name (the module attribute the
    optimizer and the process group call) while in effect."""

    def __init__(self, name):
        self.name, self.calls = name, 0

    def __enter__(self):
        self.original = getattr(mpi_ops, self.name)

        def counted(*args, **kwargs):
            self.calls += 1
            return self.original(*args, **kwargs)

        setattr(mpi_ops, self.name, counted)
        return self

    def __exit__(self, *exc):
        setattr(mpi_ops, self.name, self.original)
        return False


def gate(path, rank):
    """Rank 0 returns the function that opens the gate; the others wait for
    it to be opened."""
    if rank == 0:
        def open_gate():
            with open(path + ".tmp", "w") as f:
                f.write("open")
            os.rename(path + ".tmp", path)
        return open_gate
    deadline = time.monotonic() + GATE_SECONDS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError("rank %d: rank 0 did not reach the end of its backward pass within %d s while this "
                                 "rank had started no allreduce: its allreduces block the backward pass (%s)" %
                                 (rank, GATE_SECONDS, path))
        time.sleep(0.01)
    return None


def same_everywhere(params, what):
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    every = hvd.allgather(flat.reshape(1, -1))
    for q in range(every.shape[0]):
        if not torch.equal(every[q], every[0]):
            raise AssertionError("%s: parameters differ between rank 0 and rank %d" % (what, q))


def gated_backward(loss, first, path, rank, starts, waits, want_started, what):
    """loss.backward(), with rank 0 opening the gate from its last
    gradient's hook (after checking what it started and waited for by
    then), and the other ranks waiting for it first."""
    if rank != 0:
        gate(path, rank)
        loss.backward()
        return
    open_gate = gate(path, rank)
    seen = {}

    def at_last_gradient(grad):
        seen["started"], seen["waited"] = starts.calls, waits.calls if waits is not None else 0
        open_gate()

    handle = first.register_hook(at_last_gradient)
    loss.backward()
    handle.remove()
    if not seen:
        raise AssertionError("%s: the first layer's gradient hook never ran" % what)
    if seen["started"] < want_started:
        raise AssertionError("%s: %d bucket allreduces started before backward's last gradient, want %d: the "
                             "exchange does not overlap backward" % (what, seen["started"], want_started))
    if seen["waited"]:
        raise AssertionError("%s: %d waits for an allreduce during backward" % (what, seen["waited"]))


def check_optimizer(directory):
    r = hvd.rank()
    model = model_fn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    first = model[0].weight
    # Every bucket without a first-layer parameter is complete before the
    # first layer's weight gradient is computed.
    firsts = {model[0].weight, model[0].bias}
    want = sum(1 for g in opt._order if not any(p in firsts for p in g))
    if want < 2:
        raise AssertionError("optimizer: %d buckets before the first layer's, want at least 2 for this test" % want)
    for step in range(2):
        x, y = batch(r, step)
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(model(x), dim=1), y)
        # _grouped_allreduce_async: what DistributedOptimizer calls for a
        # bucket (grouped_allreduce_async_ without its name handling).
        with Counted("_grouped_allreduce_async") as starts, Counted("synchronize") as waits:
            gated_backward(loss, first, os.path.join(directory, "optimizer-%d" % step), r, starts, waits, want,
                           "DistributedOptimizer step %d" % step)
        opt.step()
    same_everywhere(model.parameters(), "DistributedOptimizer")


def ddp_setup():
    """The DDP checks' start: the default group on the gorovod backend, the
    model in DistributedDataParallel with buckets of 1 MiB at most (the two
    large weights and what is around them in several buckets), SGD over it;
    returns this rank, the model, the DDP module, the optimizer and the
    first layer's weight (the last gradient backward computes)."""
    import torch.distributed as dist
    import gorovod.torch.distributed  # noqa: F401 (registers the backend)
    dist.init_process_group("gorovod")
    model = model_fn()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    return dist.get_rank(), model, ddp, opt, model[0].weight


def check_ddp(directory):
    import torch.distributed as dist
    r, model, ddp, opt, first = ddp_setup()
    # DDP (torch 1.13, find_unused_parameters off) reduces the first step's
    # gradients in one bucket, once backward is over, and then rebuilds its
    # buckets in the order the gradients came (with a broadcast in the next
    # forward pass): the steps after the first overlap.
    for step in range(3):
        x, y = batch(r, step)
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(ddp(x), dim=1), y)
        if step == 0:
            loss.backward()
        else:
            with Counted("allreduce_async_") as starts:
                gated_backward(loss, first, os.path.join(directory, "ddp-%d" % step), r, starts, None, 1,
                               "DistributedDataParallel step %d" % step)
        opt.step()
    same_everywhere(model.parameters(), "DistributedDataParallel")
    dist.destroy_process_group()


def check_ddp_reduced_in_backward():
    """DistributedDataParallel's first bucket is reduced while backward
    still runs: every rank, in its last gradient's hook (the first layer's
    weight, computed after every other bucket was handed to the process
    group), waits until the future of the first bucket's allreduce (what
    DDP's reducer waits on at the end of backward) is complete, polling with
    a deadline. It completes only if the process group runs the allreduce
    and completes the future with nothing more from the training thread:
    not a wait() on the work, not the end of backward."""
    import torch.distributed as dist
    from gorovod.torch import distributed as backend
    r, model, ddp, opt, first = ddp_setup()
    futures = []  # the futures of this pass's bucket allreduces, in submission order
    original = backend.ProcessGroupGorovod._allreduce

    def recorded(self, tensors, opts, what):
        work = original(self, tensors, opts, what)
        futures.append(work.get_future())
        return work

    backend.ProcessGroupGorovod._allreduce = recorded
    try:
        # The first step reduces every gradient in one bucket at the end of
        # backward (see check_ddp); the later ones overlap.
        for step in range(3):
            x, y = batch(r, step)
            opt.zero_grad()
            loss = F.nll_loss(F.log_softmax(ddp(x), dim=1), y)
            del futures[:]
            if step == 0:
                loss.backward()
                opt.step()
                continue
            seen = {}

            def at_last_gradient(grad):
                seen["started"] = len(futures)
                if not futures:
                    return
                deadline = time.monotonic() + GATE_SECONDS
                while not futures[0].done() and time.monotonic() < deadline:
                    time.sleep(0.001)
                seen["done"] = futures[0].done()

            handle = first.register_hook(at_last_gradient)
            loss.backward()
            handle.remove()
            what = "DistributedDataParallel step %d" % step
            if not seen:
                raise AssertionError("%s: the first layer's gradient hook never ran" % what)
            if not seen["started"]:
                raise AssertionError("%s: no bucket allreduce started before backward's last gradient" % what)
            if not seen["done"]:
                raise AssertionError("%s: the first bucket's allreduce (of %d started by then) was not complete %d s "
                                     "after backward reached its last gradient: the process group does not reduce "
                                     "a bucket while backward runs" % (what, seen["started"], GATE_SECONDS))
            opt.step()
    finally:
        backend.ProcessGroupGorovod._allreduce = original
    same_everywhere(model.parameters(), "DistributedDataParallel (reduced in backward)")
    dist.destroy_process_group()


def main():
    directory = os.environ["OVERLAP_TEST_DIR"]
    hvd.init()
    if hvd.size() < 2:
        raise AssertionError("run this test with at least 2 workers")
    check_optimizer(directory)
    check_ddp(directory)
    check_ddp_reduced_in_backward()
    print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)


if __name__ == "__main__":
    main()
