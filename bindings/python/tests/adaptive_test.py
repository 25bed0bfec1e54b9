"""AdaptiveDataLoader and AdaptiveOptimizer under real training: a noisy
linear classification problem whose gradient noise makes the job grow its
batch size. Checks, on every rank:

- the sampler is exact across batch-size changes: the indices all ranks
  trained on, step by step in rank order, are the epochs' permutations one
  after the other (none lost, none repeated);
- the batch size changed during training (the Go side decided it) and every
  rank ran the same plan (global batch, learning-rate factor) at every step;
- each step applied the workers' mean of their micro-batches' mean gradients
  (computed here apart) times the learning rate times the step's factor
  (plain SGD), and the factor follows the rule (linear: global/M0; sqrt: its
  square root; adascale: between 1 and global/M0);
- with "accumulate", steps of several micro-batches happened.

Usage: adaptive_test.py RULE [accumulate]. Prints "PASS rank R of N". Driven by
bindings/python/adaptive_test.go.
"""

import copy
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import gorovod.torch as hvd
import gorovod.torch.adaptive

N, FEATURES, CLASSES, M0, MAX_BATCH = 4000, 20, 4, 16, 512


class Noisy(torch.utils.data.Dataset):
    """Linear classes with a third of the labels random: a large gradient
    noise scale, so larger batches stay efficient."""

    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(N, FEATURES, generator=g)
        w = torch.randn(FEATURES, CLASSES, generator=g)
        self.y = (self.x @ w).argmax(1)
        flip = torch.rand(N, generator=g) < 0.33
        self.y[flip] = torch.randint(0, CLASSES, (int(flip.sum()),), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def permutation(epoch):
    """The loader's permutation of an epoch (shuffle=True, seed=3)."""
    g = torch.Generator()
    g.manual_seed(3 + epoch)
    return torch.randperm(N, generator=g).tolist()


def check_order(mine, batches):
    """The indices all ranks trained on, step by step in rank order, are the
    epochs' permutations one after the other: none lost, none repeated, in
    whatever batch sizes."""
    n = hvd.size()
    every = hvd.allgather(torch.tensor(mine, dtype=torch.int64))
    counts = hvd.allgather(torch.tensor([len(mine)])).tolist()
    lists, at = [], 0
    for c in counts:
        lists.append(every[at:at + c].tolist())
        at += c
    used, pos = [], [0] * n
    for b in batches:
        for q, share in enumerate(gorovod.torch.adaptive.shares(b, n)):
            used += lists[q][pos[q]:pos[q] + share]
            pos[q] += share
    want = []
    epoch = 0
    while len(want) < len(used):
        want += permutation(epoch)
        epoch += 1
    if used != want[:len(used)]:
        first = next(i for i in range(len(used)) if used[i] != want[i])
        raise AssertionError("sample %d of the run is index %d, the permutations say %d" % (first, used[first], want[first]))
    return len(used)


def flat_grad(model, micro):
    """The mean over the micro-batches of their mean-loss gradients, at the
    model's parameters."""
    model.zero_grad()
    for x, y in micro:
        (F.cross_entropy(model(x), y) / len(micro)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def main(rule, accumulation):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(1)
    model = nn.Linear(FEATURES, CLASSES)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    lr = 0.05
    loader = hvd.AdaptiveDataLoader(Noisy(), batch_size=M0, shuffle=True, seed=3)
    # With accumulation, micro-batches small enough that growing needs it
    # (alone, any batch beyond M0 accumulates, to measure the noise).
    hi = MAX_BATCH if not accumulation else 8 if n > 1 else 32
    loader.autoscale_batch_size(MAX_BATCH, local_bsz_bounds=(4, hi), gradient_accumulation=accumulation)
    dist = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), named_parameters=model.named_parameters())
    opt = hvd.AdaptiveOptimizer(dist, loader, lr_rule=rule)
    plans, mine, micro, deadline = [], [], [], time.monotonic() + 90
    epoch, changed_epochs = 0, 0
    while True:
        for x, y, idx in loader:
            plan = loader.plan
            if loader.micro_index == 0:
                before = copy.deepcopy(model)
                micro = []
            micro.append((x, y))
            mine += idx.tolist()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if loader.accumulating:
                continue
            if sum(len(b[0]) for b in micro) != plan.local_batch or len(micro) != plan.accum_steps + 1:
                raise AssertionError("a step of %d micro-batches, %d samples; the plan says %s" % (
                    len(micro), sum(len(b[0]) for b in micro), plan))
            if plan.accum_steps and not accumulation:
                raise AssertionError("accumulating without gradient_accumulation: %s" % (plan,))
            plans.append((plan.global_batch, plan.lr_factor, plan.accum_steps))
            scale = plan.global_batch / M0
            factor = plan.lr_factor
            want = {"linear": scale, "sqrt": math.sqrt(scale)}.get(rule)
            if want is not None and abs(factor - want) > 2 ** -15 * max(1, want):
                raise AssertionError("%s: factor %r at batch %d, want %r" % (rule, factor, plan.global_batch, want))
            if rule == "adascale" and not (1 - 2 ** -15 <= factor <= scale + 2 ** -15):
                raise AssertionError("adascale factor %r outside [1, %r]" % (factor, scale))
            # The step applied lr × factor × the workers' mean of their
            # micro-batches' mean gradients.
            mean = hvd.allgather(flat_grad(before, micro).reshape(1, -1)).double().mean(0)
            got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
            if not torch.allclose(got, mean, rtol=1e-4, atol=1e-6):
                raise AssertionError("the reduced gradient is not the mean over micro-batches and workers")
            delta = torch.cat([(p - q).detach().reshape(-1) for p, q in zip(model.parameters(), before.parameters())])
            if not torch.allclose(delta.double(), -lr * factor * mean, rtol=1e-3, atol=1e-6):
                raise AssertionError("the step did not use lr × factor %r" % factor)
        sizes = {b for b, _, _ in plans}
        if len(sizes) > 1:
            changed_epochs += 1
        epoch += 1
        if changed_epochs >= 2 or time.monotonic() > deadline:
            break
    sizes = sorted({b for b, _, _ in plans})
    if len([b for b in sizes if b > M0]) == 0:
        raise AssertionError("the batch size never grew in %d epochs (%d steps)" % (epoch, len(plans)))
    accums = sorted({a for _, _, a in plans})
    if accumulation and accums == [0]:
        raise AssertionError("gradient_accumulation, but no step accumulated (batches %s)" % sizes)
    used = check_order(mine, [b for b, _, _ in plans])
    every = hvd.allgather(torch.tensor(plans, dtype=torch.float64).reshape(1, -1))
    for q in range(n):
        if not torch.equal(every[q], every[0]):
            raise AssertionError("rank %d ran other plans than rank 0" % q)
    print("rank %d: %d epochs, %d steps, %d samples in order, global batches %s, accumulation steps %s, "
          "last factor %.4g" % (r, epoch, len(plans), used, sizes, accums, plans[-1][1]), flush=True)
    print("PASS rank %d of %d" % (r, n), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["accumulate"])
