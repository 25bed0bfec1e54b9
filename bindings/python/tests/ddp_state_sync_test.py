"""The elastic DDP state's sync (gorovod.torch.distributed.elastic.State)
sends only the parameters and buffers whose digest differs on some rank, and
DDP's own construction broadcast then sends nothing: each case gives the
ranks a module that agrees or differs in known places, counts the tensors
the digest sync broadcasts (mpi_ops.grouped_broadcast_) and the broadcasts
the backend makes for DDP (mpi_ops.broadcast_async_), and checks the
module's tensors afterwards against rank 0's (or, for those DDP leaves
alone, against the rank's own), and that the DDP module then trains alike.

Prints "PASS rank R of N". Driven by bindings/python/python_test.go.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import gorovod.torch.distributed  # noqa: F401 (the rendezvous)
from gorovod.torch import mpi_ops
from gorovod.torch.distributed import elastic

dist.init_process_group("gorovod")
me, n = dist.get_rank(), dist.get_world_size()
last = n - 1
torch.set_num_threads(1)

held, ddp_broadcasts = [], []
_grouped, _bcast = mpi_ops.grouped_broadcast_, mpi_ops.broadcast_async_


def counting_grouped(tensors, root_rank):
    tensors = list(tensors)
    held.extend(tensors)
    return _grouped(tensors, root_rank)


def counting_bcast(tensor, root_rank, *args, **kwargs):
    ddp_broadcasts.append(tensor)
    return _bcast(tensor, root_rank, *args, **kwargs)


mpi_ops.grouped_broadcast_ = counting_grouped
mpi_ops.broadcast_async_ = counting_bcast


def module_fn():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def gathered(t):
    t = t.detach().reshape(-1).to(torch.float64)
    out = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(out, t)
    return out


_wrap = elastic.State._wrap


def counting_wrap(self):
    # Only DDP's construction counts: the optimizer's and the attributes'
    # sync after it broadcast (pickles) too.
    del ddp_broadcasts[:]
    _wrap(self)
    self.ddp_broadcasts = len(ddp_broadcasts)


elastic.State._wrap = counting_wrap

cases = [
    # (case, ddp_kwargs, names DDP ignores, what the last rank changes, what must travel)
    ("identical", {}, (), (), set()),
    ("one weight differs on the last rank", {}, (), ("3.weight",), {"3.weight"}),
    ("a running mean differs on the last rank", {}, (), ("1.running_mean",), {"1.running_mean"}),
    ("buffers not broadcast (broadcast_buffers=False)", {"broadcast_buffers": False}, (), ("1.running_mean",),
     set()),
    ("an ignored parameter differs on the last rank", {}, ("0.bias",), ("0.bias", "3.bias"), {"3.bias"}),
]
for case, ddp_kwargs, ignored, changed, want in cases:
    module = module_fn()
    if ignored:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, list(ignored))
    tensors = dict(list(module.named_parameters()) + list(module.named_buffers()))
    if me == last:
        with torch.no_grad():
            for name in changed:
                tensors[name].add_(1.0)
    before = {name: t.detach().clone() for name, t in tensors.items()}
    # What DDP leaves alone: the tensors it ignores, and the buffers when it
    # does not broadcast them.
    alone = set(ignored) | ({name for name, _ in module.named_buffers()}
                            if ddp_kwargs.get("broadcast_buffers") is False else set())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    state = elastic.State(module, optimizer, ddp_kwargs=ddp_kwargs, epoch=0)
    names = {t.data_ptr(): name for name, t in tensors.items()}
    del held[:]
    state.sync()
    got = {names.get(t.data_ptr(), "?") for t in held}
    if got != (want if n > 1 else set()):
        raise AssertionError("%s: the sync sent %s, want %s" % (case, sorted(got), sorted(want)))
    if state.ddp_broadcasts:
        raise AssertionError("%s: DDP's construction broadcast %d tensors after the digest sync" %
                             (case, state.ddp_broadcasts))
    for name, t in tensors.items():
        if name in alone:
            if not torch.equal(t, before[name]):
                raise AssertionError("%s: %s was changed, DDP leaves it alone" % (case, name))
            continue
        every = gathered(t)
        for q in range(n):
            if not torch.equal(every[q], every[0]):
                raise AssertionError("%s: %s differs between rank 0 and rank %d after sync" % (case, name, q))
    # The DDP module trains: a step's gradients are averaged, so the
    # parameters DDP syncs stay equal.
    g = torch.Generator().manual_seed(100 + me)
    optimizer.zero_grad()
    F.cross_entropy(state.model(torch.randn(8, 6, generator=g)), torch.randint(0, 3, (8,), generator=g)).backward()
    optimizer.step()
    for name, p in module.named_parameters():
        if name in ignored:
            continue
        every = gathered(p)
        for q in range(n):
            if not torch.equal(every[q], every[0]):
                raise AssertionError("%s: %s differs on rank %d after a DDP step" % (case, name, q))

print("PASS rank %d of %d" % (me, n), flush=True)
dist.destroy_process_group()
