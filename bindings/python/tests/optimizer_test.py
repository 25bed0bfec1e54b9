"""DistributedOptimizer, broadcast_parameters and broadcast_optimizer_state
against a reference computed in this process: each rank builds every rank's
batches from (rank, step), so it can compute the update a world of n must
make (the average of the ranks' gradients, accumulated over
backward_passes_per_step passes) and compare. Parameters must also be
bit-identical on every rank after every step.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gorovod.torch as hvd


def model_fn(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def batch(r, step, k):
    g = torch.Generator().manual_seed(10000 * r + 100 * step + k)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


def same_everywhere(t, what):
    every = hvd.allgather(t.reshape(1, -1))
    for q in range(every.shape[0]):
        if not torch.equal(every[q], every[0]):
            raise AssertionError("%s differs between rank 0 and rank %d" % (what, q))


def check_optimizer(opt_name, passes, compression, steps=4):
    r, n = hvd.rank(), hvd.size()
    what = "%s passes=%d %s" % (opt_name, passes, compression.__name__)
    model = model_fn(seed=1 + r)  # different on every rank until broadcast
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    same_everywhere(flat(model.parameters()), what + ": parameters after broadcast_parameters")
    reference = copy.deepcopy(model)

    def make(params):
        if opt_name == "sgd":
            return torch.optim.SGD(params, lr=0.1, momentum=0.9)
        return torch.optim.Adam(params, lr=0.01)

    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes)
    ref_opt = make(reference.parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            x, y = batch(r, step, k)
            F.cross_entropy(model(x), y).backward()
        opt.step()
        # The reference: the ranks' accumulated gradients, averaged.
        ref_opt.zero_grad()
        for q in range(n):
            for k in range(passes):
                x, y = batch(q, step, k)
                (F.cross_entropy(reference(x), y) / n).backward()
        ref_opt.step()
        got, want = flat(model.parameters()), flat(reference.parameters())
        same_everywhere(got, "%s: parameters after step %d" % (what, step))
        tol = 2e-3 if compression is hvd.Compression.fp16 else 1e-5
        if not torch.allclose(got, want, rtol=tol, atol=tol):
            raise AssertionError("%s: step %d: max difference from the reference %g" %
                                 (what, step, (got - want).abs().max().item()))


def check_broadcast_optimizer_state(opt_name):
    """Rank 0's optimizer has state (it took steps, and a changed learning
    rate); the others' are fresh: afterwards all are rank 0's."""
    r = hvd.rank()
    model = model_fn(seed=7)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.01))
    if r == 0:
        for step in range(3):
            opt.zero_grad()
            x, y = batch(0, step, 0)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        for g in opt.param_groups:
            g["lr"] = 0.123
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert all(g["lr"] == 0.123 for g in opt.param_groups), "%s: lr not broadcast" % opt_name
    sd = opt.state_dict()
    assert len(sd["state"]) == len(list(model.parameters())), "%s: state of %d parameters" % (opt_name,
                                                                                            len(sd["state"]))
    tensors = []
    for pid in sorted(sd["state"]):
        for key in sorted(sd["state"][pid]):
            v = sd["state"][pid][key]
            tensors.append(v.reshape(-1).to(torch.float64) if torch.is_tensor(v) else torch.tensor([float(v)],
                                                                                                   dtype=torch.float64))
    same_everywhere(torch.cat(tensors), "%s: optimizer state" % opt_name)


def check_buckets():
    """Without groups, a gradient of at least 1 MiB is reduced alone and the
    small ones together: one library call per bucket and step, and each
    gradient the average of the ranks' own."""
    from gorovod import _core
    from gorovod.torch import optimizer
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16384), nn.ReLU(), nn.Linear(16384, 3))
    params = list(model.parameters())
    buckets = optimizer._buckets(params)
    big = model[2].weight  # 16384 x 16 float32: 1 MiB
    assert [len(b) for b in buckets] == [1, 5] and buckets[0][0] is big, [[tuple(p.shape) for p in b] for b in buckets]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = copy.deepcopy(model)  # its gradients are this rank's own
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=model.named_parameters())
    x, y = batch(hvd.rank(), 0, 0)
    F.cross_entropy(reference(x), y).backward()
    local = [p.grad for p in reference.parameters()]
    calls = []
    issue = _core.grouped_allreduce_async
    _core.grouped_allreduce_async = lambda *a, **k: calls.append(len(a[1])) or issue(*a, **k)
    try:
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
    finally:
        _core.grouped_allreduce_async = issue
    assert sorted(calls) == [1, 5], "library calls per step (tensors in each): %s" % calls
    for p, g in zip(params, local):
        want = hvd.allreduce(g, op=hvd.Average)
        if not torch.allclose(p.grad, want, rtol=1e-6, atol=1e-7):
            raise AssertionError("bucketed gradient of shape %s is not the ranks' average" % (tuple(p.shape),))
    with opt.skip_synchronize():
        opt.step()


def main():
    hvd.init()
    check_buckets()
    for opt_name in ("sgd", "adam"):
        for passes in (1, 2):
            for compression in (hvd.Compression.none, hvd.Compression.fp16):
                check_optimizer(opt_name, passes, compression)
        check_broadcast_optimizer_state(opt_name)

    # Gradients computed more often than backward_passes_per_step: Horovod's error.
    model = model_fn(seed=3)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = batch(0, 0, 0)
    F.cross_entropy(model(x), y).backward()
    try:
        F.cross_entropy(model(x), y).backward()
        raise AssertionError("a second backward pass before step() was not refused")
    except AssertionError as e:
        if "backward_passes_per_step" not in str(e):
            raise
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()

    print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
