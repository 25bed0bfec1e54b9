"""What an elastic TorchState.sync() costs after a world change, with the
digests (only the tensors that differ somewhere travel) against the
broadcast of everything (broadcast_parameters + broadcast_optimizer_state,
what sync did before, and what Horovod's does), for a model of --params
float32 parameters in --layers Linear layers with SGD momentum (as much
optimizer state again). Run it under `gorovod run`:

    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bindings/python/bench/state_sync.py
    gorovod run --np 4 --min-np 4 -- /usr/bin/python3 bindings/python/bench/state_sync.py --params 50000000

With --ddp, the same for the elastic DDP state
(gorovod.torch.distributed.elastic.State, on the backend "gorovod"): its
sync (digests, then DDP's construction, whose broadcast then sends nothing)
against DDP's construction broadcasting the module plus
broadcast_optimizer_state.

Three states, each timed with both ways, interleaved, --repeats times:

- same: every worker holds the same state (a world that only lost
  members; nothing needs to travel);
- joiner: the last rank holds the same first --frozen-layers layers (frozen,
  as loaded from the same checkpoint) and different values in the others,
  its optimizer state as everyone's in layout (a worker that joins with a
  state of its own, e.g. one left out and back);
- all differ: every tensor differs on the last rank (the digests' cost
  without any gain).

The digests' way is the whole sync(), with its pickle of the plain
attributes (one small broadcast more). Rank 0 prints one RESULT line per state and way: median [min-max] ms of
the slowest rank, and MB sent.
"""

import argparse
import statistics
import time

import torch
import torch.nn as nn

import gorovod.torch as hvd
from gorovod.torch import functions

parser = argparse.ArgumentParser()
parser.add_argument("--params", type=int, default=25_000_000, help="parameters in all (float32)")
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--frozen-layers", type=int, default=6)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--ddp", action="store_true", help="the elastic DDP state instead of TorchState")
args = parser.parse_args()

if args.ddp:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import gorovod.torch.distributed  # noqa: F401 (the rendezvous)
    from gorovod.torch.distributed import elastic as ddp_elastic

    dist.init_process_group("gorovod")
hvd.init()
torch.set_num_threads(1)
me, n = hvd.rank(), hvd.size()
width = int((args.params / args.layers) ** 0.5)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(args.layers)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for p in model.parameters():
    optimizer.state[p]["momentum_buffer"] = torch.full_like(p, 0.5)
if args.ddp:
    state = ddp_elastic.State(model, optimizer, epoch=0)
else:
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
layers = list(model.parameters())
sent_bytes = []
_grouped = functions.mpi_ops.grouped_broadcast_


def counting(tensors, root_rank):
    tensors = list(tensors)
    sent_bytes.append(sum(t.numel() * t.element_size() for t in tensors))
    return _grouped(tensors, root_rank)


functions.mpi_ops.grouped_broadcast_ = counting
_single = functions.mpi_ops.broadcast_async_


def counting_single(tensor, root_rank, *rest, **kwargs):
    # The backend's broadcasts for DDP (and broadcast_object's pickles).
    sent_bytes.append(tensor.numel() * tensor.element_size())
    return _single(tensor, root_rank, *rest, **kwargs)


functions.mpi_ops.broadcast_async_ = counting_single


def momentum():
    # Read each time: broadcast_optimizer_state replaces a non-root's.
    return [optimizer.state[p]["momentum_buffer"] for p in layers]


def prepare(kind):
    with torch.no_grad():
        for i, (p, b) in enumerate(zip(layers, momentum())):
            p.fill_(0.001 * i)
            b.fill_(0.5)
            if me == n - 1 and (kind == "all differ" or (kind == "joiner" and i >= args.frozen_layers)):
                p.add_(1.0)
                b.add_(1.0)


def digests():
    state.sync()


def everything():
    if args.ddp:
        DistributedDataParallel(model)  # broadcasts the module from rank 0
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)


results = {}
for _ in range(args.repeats):
    for kind in ("same", "joiner", "all differ"):
        for way, fn in (("digests", digests), ("everything", everything)):
            prepare(kind)
            hvd.barrier()
            del sent_bytes[:]
            t0 = time.perf_counter()
            fn()
            took = torch.tensor([time.perf_counter() - t0])
            slowest = hvd.allreduce(took, op=hvd.Max)
            results.setdefault((kind, way), []).append((float(slowest) * 1e3, sum(sent_bytes) / 1e6))
            for p, b in zip(layers, momentum()):
                ref = hvd.broadcast(torch.stack([p.view(-1)[-1], b.view(-1)[-1]]), 0)
                assert torch.equal(ref, torch.stack([p.view(-1)[-1], b.view(-1)[-1]])), "not synced"

if me == 0:
    for (kind, way), xs in results.items():
        ms = [x[0] for x in xs]
        print("RESULT%s np=%d params=%d state=%-10s way=%-10s ms=%.1f [%.1f-%.1f] MB_sent=%.0f" %
              (" ddp" if args.ddp else "", n, args.params, kind, way, statistics.median(ms), min(ms), max(ms), xs[-1][1]), flush=True)
if args.ddp:
    dist.destroy_process_group()
hvd.shutdown()
