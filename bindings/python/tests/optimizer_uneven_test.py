"""DistributedOptimizer when the ranks do not produce the same gradients, or
not in the same order (issue 24): a branch taken on some ranks only, a
parameter unused on a rank, a backward pass whose hooks fire in another order
on another rank.

The model has two parameters of the same size (so a bucket of one paired with
the other's would not be refused as a mismatch, only summed wrongly), each its
own bucket. uses(r, k) says which parameters rank r's forward pass k applies,
in which order (the one applied last has its gradient produced first). Every
rank builds every rank's batches from (rank, step, pass), so it can compute
the gradient a world of n must reduce to: the average over the ranks of each
rank's accumulated gradient, zero for a rank that produced none (as Horovod
does), computed in this process; each step's reduced gradients must equal it,
and the parameters must be the same on every rank.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import copy
import sys

import torch
import torch.nn as nn

import gorovod.torch as hvd


class Two(nn.Module):
    def __init__(self, n):
        super(Two, self).__init__()
        self.a = nn.Parameter(torch.randn(n))
        self.b = nn.Parameter(torch.randn(n))

    def forward(self, x, uses):
        h = x
        for name in uses:
            h = h * getattr(self, name)
        return (h * h).mean()


def batch(n, r, step, k):
    g = torch.Generator().manual_seed(10000 * r + 100 * step + k)
    return torch.randn(4, n, generator=g)


# Which parameters rank r's pass k applies, and in which order.
SCENARIOS = {
    # Rank 0 produces b's gradient first, then a's; the others only a's, so
    # their hooks start a, and b waits for synchronize().
    "rank 0 uses both, the others a only": lambda r, k: "ab" if r == 0 else "a",
    "rank 0 uses both, the others b only": lambda r, k: "ba" if r == 0 else "b",
    # Every rank produces one gradient, not the same one everywhere.
    "each rank uses one": lambda r, k: "a" if r % 2 == 0 else "b",
    # Every rank produces both, in an order that differs between ranks.
    "hook order differs": lambda r, k: "ab" if r % 2 == 0 else "ba",
    # Accumulated over two passes, one of which leaves a out on rank 1.
    "a missing from one pass": lambda r, k: "ba" if r != 1 or k == 1 else "b",
}


def check(name, uses, numel, groups, passes, failures, steps=3):
    """Appends to failures what first went wrong, without raising: every rank
    runs the same collectives whatever it finds, so one scenario's failure on
    some ranks does not throw the next out of step."""
    r, n = hvd.rank(), hvd.size()
    bad = []
    what = "%s (%d elements, groups=%s, passes=%d)" % (name, numel, groups, passes)
    torch.manual_seed(5 + r)  # different on every rank until broadcast
    model = Two(numel)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    reference = copy.deepcopy(model)
    group_arg = [[model.a], [model.b]] if groups else None
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), groups=group_arg,
                                   backward_passes_per_step=passes)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(steps):
        # Both kinds of zero_grad: gradients left at zero, and set to None
        # (then a parameter this rank does not use has none).
        opt.zero_grad(set_to_none=step % 2 == 1)
        for k in range(passes):
            model(batch(numel, r, step, k), uses(r, k)).backward()
        opt.synchronize()

        ref_opt.zero_grad(set_to_none=True)
        for q in range(n):
            for k in range(passes):
                (reference(batch(numel, q, step, k), uses(q, k)) / n).backward()
        for pname in ("a", "b"):
            got = getattr(model, pname).grad
            want = getattr(reference, pname).grad
            if want is None:
                want = torch.zeros_like(got)
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-7):
                bad.append("%s: step %d: gradient of %s differs from the ranks' average by up to %g" %
                           (what, step, pname, (got - want).abs().max().item()))
        with opt.skip_synchronize():
            opt.step()
        ref_opt.step()
        got = torch.cat([model.a.detach(), model.b.detach()])
        every = hvd.allgather(got.reshape(1, -1))
        for q in range(n):
            if not torch.equal(every[q], every[0]):
                bad.append("%s: step %d: parameters differ between rank 0 and rank %d" % (what, step, q))
        want = torch.cat([reference.a.detach(), reference.b.detach()])
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
            bad.append("%s: step %d: parameters differ from the reference by up to %g" %
                       (what, step, (got - want).abs().max().item()))
    if bad:
        failures.append("%s (%d checks failed in all)" % (bad[0], len(bad)))


def main():
    hvd.init()
    failures = []
    for name, uses in SCENARIOS.items():
        passes = 2 if "pass" in name else 1
        # 1 MiB of float32 each: each parameter is a bucket of its own by
        # default. Then small ones, put in a group each.
        check(name, uses, 1 << 18, False, passes, failures)
        check(name, uses, 7, True, passes, failures)
    if failures:
        raise AssertionError("rank %d: %d failures:\n%s" % (hvd.rank(), len(failures), "\n".join(failures)))
    print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
