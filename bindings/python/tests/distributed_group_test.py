"""torch.distributed's new_group on the "gorovod" backend (3 or more ranks).

Groups of some ranks (made with backend="gorovod" and with the default
backend) run every collective the backend offers among their members,
checked against values each rank computes alone; ranks outside a group get
torch's GroupMember.NON_GROUP_MEMBER and their tensors are left alone; two
groups of the same ranks, a group of the same ranks as the script's own
process set and a group of every rank work beside them;
destroy_process_group(group) drops one group while the others go on; and
DistributedDataParallel on two disjoint groups at once (the even and the
odd ranks) trains each group to the parameters of one process on the
group's whole batch, the same on every member, different between the
groups.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import gc
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupMember

import gorovod.torch as hvd
import gorovod.torch.distributed  # noqa: F401 (registers the backend)

dist.init_process_group("gorovod")
r, n = dist.get_rank(), dist.get_world_size()
if n < 3:
    raise SystemExit("distributed_group_test.py needs 3 or more ranks, got %d" % n)


def same(what, got, want):
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        raise AssertionError("rank %d: %s:\ngot  %s\nwant %s" % (r, what, got.tolist(), want.tolist()))


def check_group(label, group, ranks):
    """Every collective on group (of the world ranks `ranks`), run on every
    rank: members check the results, the others that torch leaves their
    tensors alone."""
    if r not in ranks:
        if group is not GroupMember.NON_GROUP_MEMBER:
            raise AssertionError("rank %d: %s is %r outside its ranks %s" % (r, label, group, ranks))
        t = torch.full((3,), float(r))
        dist.all_reduce(t, group=group)  # torch warns and does nothing
        same("%s: all_reduce outside the group" % label, t, torch.full((3,), float(r)))
        return
    m, k = ranks.index(r), len(ranks)
    got = (dist.get_rank(group), dist.get_world_size(group), dist.get_backend(group))
    if got != (m, k, "gorovod"):
        raise AssertionError("rank %d: %s: rank, size, backend %s, want %s" % (r, label, got, (m, k, "gorovod")))
    what = "%s %s" % (label, ranks)
    # all_reduce: each op, sync and async; the values are world ranks, so a
    # reduction over the wrong ranks shows.
    base = torch.arange(5, dtype=torch.float32) + 1
    for op, want in ((dist.ReduceOp.SUM, sum(base * (q + 1) for q in ranks)),
                     (dist.ReduceOp.MAX, base * (max(ranks) + 1)),
                     (dist.ReduceOp.MIN, base * (min(ranks) + 1)),
                     (dist.ReduceOp.PRODUCT, base ** k * float(torch.prod(torch.tensor([q + 1.0 for q in ranks]))))):
        t = base * (r + 1)
        dist.all_reduce(t, op=op, group=group)
        same("%s: all_reduce %s" % (what, op), t, want)
    t = torch.full((4,), float(r))
    work = dist.all_reduce(t, async_op=True, group=group)
    work.wait()
    same("%s: async all_reduce" % what, t, torch.full((4,), float(sum(ranks))))
    t = torch.full((2,), float(r), dtype=torch.float64)
    fut = dist.all_reduce(t, async_op=True, group=group).get_future()
    same("%s: all_reduce future" % what, fut.wait()[0], torch.full((2,), float(sum(ranks)), dtype=torch.float64))
    # broadcast: src is a world rank, as in torch.
    for src in ranks:
        t = torch.full((2, 2), float(r))
        dist.broadcast(t, src=src, group=group)
        same("%s: broadcast from %d" % (what, src), t, torch.full((2, 2), float(src)))
    outs = [torch.empty(3) for _ in range(k)]
    dist.all_gather(outs, torch.full((3,), float(r)), group=group)
    for i, q in enumerate(ranks):
        same("%s: all_gather[%d]" % (what, i), outs[i], torch.full((3,), float(q)))
    out = torch.empty(k * 2)
    getattr(dist, "all_gather_into_tensor", dist._all_gather_base)(out, torch.full((2,), float(r)), group=group)
    same("%s: all_gather_into_tensor" % what, out, torch.tensor([float(q) for q in ranks]).repeat_interleave(2))
    # reduce_scatter: member i keeps the sum of every member's i-th part.
    parts = [torch.full((2,), float(r * 10 + i)) for i in range(k)]
    out = torch.empty(2)
    dist.reduce_scatter(out, parts, group=group)
    same("%s: reduce_scatter" % what, out, torch.full((2,), float(sum(q * 10 + m for q in ranks))))
    out = torch.empty(2)
    getattr(dist, "reduce_scatter_tensor", dist._reduce_scatter_base)(out, torch.cat(parts), group=group)
    same("%s: reduce_scatter_tensor" % what, out, torch.full((2,), float(sum(q * 10 + m for q in ranks))))
    # all_to_all: member i sends r*10+j to member j.
    outs = [torch.empty(2) for _ in range(k)]
    dist.all_to_all(outs, [torch.full((2,), float(r * 10 + j)) for j in range(k)], group=group)
    for i, q in enumerate(ranks):
        same("%s: all_to_all[%d]" % (what, i), outs[i], torch.full((2,), float(q * 10 + m)))
    out = torch.empty(k)
    dist.all_to_all_single(out, torch.arange(k, dtype=torch.float32) + 100 * r, group=group)
    same("%s: all_to_all_single" % what, out, torch.tensor([100.0 * q + m for q in ranks]))
    dist.barrier(group=group)


evens = list(range(0, n, 2))
odds = list(range(1, n, 2))
# The script's own process set: new_group of the same ranks runs on it.
mine = hvd.add_process_set(evens)
low = list(range(n - 1))  # every rank but the last
high = list(range(1, n))  # every rank but the first
groups = {
    "low": (dist.new_group(ranks=low, backend="gorovod"), low),
    "high (default backend)": (dist.new_group(ranks=high), high),
    "low again": (dist.new_group(ranks=low), low),
    "everyone": (dist.new_group(), list(range(n))),
    "evens": (dist.new_group(ranks=evens), evens),
    "odds": (dist.new_group(ranks=odds), odds),
}
for label, (group, ranks) in groups.items():
    check_group(label, group, ranks)
# The default group between and after the groups' collectives.
t = torch.full((2,), float(r))
dist.all_reduce(t)
same("world all_reduce", t, torch.full((2,), float(sum(range(n)))))

# Destroying one of two groups of the same ranks leaves the other working.
dist.destroy_process_group(groups["low again"][0])
check_group("low after its twin was destroyed", *groups["low"])


def completers():
    return sum(1 for th in threading.enumerate() if th.name == "gorovod-pg-completer")


# A destroyed group that nothing holds any more ends its completer thread.
before = completers()
temporary = dist.new_group(ranks=low)
if r in low:
    dist.all_reduce(torch.zeros(1), group=temporary)
    if completers() != before + 1:
        raise AssertionError("rank %d: %d completer threads with a new group, want %d" % (r, completers(), before + 1))
dist.destroy_process_group(temporary)
del temporary
gc.collect()
deadline = time.monotonic() + 10
while completers() != before:
    if time.monotonic() > deadline:
        raise AssertionError("rank %d: %d completer threads after destroying a group, want %d" % (r, completers(), before))
    time.sleep(0.01)

t = torch.full((1,), float(r))
if r in evens:
    hvd.allreduce_(t, op=hvd.Sum, process_set=mine)
    same("the script's process set", t, torch.full((1,), float(sum(evens))))


# DistributedDataParallel on the even and on the odd ranks at once: each
# group trains to the steps of one process on its members' batches.
def net():
    return torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


mine_name = "evens" if r % 2 == 0 else "odds"
group, ranks = groups[mine_name]
m, k = ranks.index(r), len(ranks)
torch.manual_seed(7 + r % 2)  # the two groups start apart
model, reference = net(), net()
reference.load_state_dict(model.state_dict())
if m != 0:  # DDP broadcasts the group's first rank's parameters at construction
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
per_rank, steps = 4, 4
for step in range(steps):
    g = torch.Generator().manual_seed(1000 * (r % 2) + step)
    xs = torch.randn(k * per_rank, 6, generator=g)
    ys = torch.randint(0, 3, (k * per_rank,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ddp(xs[m * per_rank:(m + 1) * per_rank]),
                                      ys[m * per_rank:(m + 1) * per_rank]).backward()
    opt.step()
    ref_opt.zero_grad()
    torch.nn.functional.cross_entropy(reference(xs), ys).backward()
    ref_opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same("DDP on %s %s after %d steps" % (mine_name, ranks, steps), flat,
     torch.cat([p.detach().reshape(-1) for p in reference.parameters()]))
# Identical within each group, different between the two.
everyone = [torch.empty_like(flat) for _ in range(n)]
dist.all_gather(everyone, flat)
for q in range(n):
    if q % 2 == r % 2 and not torch.equal(everyone[q], flat):
        raise AssertionError("rank %d: rank %d of the same group ended with other parameters" % (r, q))
    if q % 2 != r % 2 and torch.allclose(everyone[q], flat):
        raise AssertionError("rank %d: rank %d of the other group ended with the same parameters" % (r, q))

for label, (group, _) in groups.items():
    if label != "low again":
        dist.destroy_process_group(group)
dist.destroy_process_group()
print("PASS rank %d of %d" % (r, n), flush=True)
