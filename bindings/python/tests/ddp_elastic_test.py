"""Elastic DDP through gorovod.torch.distributed.elastic (State, run,
ElasticSampler) while the Go tests kill, freeze, remove or add workers.

Every worker appends to its own log file in $ELASTIC_LOG_DIR:

- "R world epoch position" each time the training function starts (after
  state.sync()): where the world resumed, the sampler's data epoch and the
  number of samples of the epoch's order the world had trained on;
- "S world epoch position rank size i1 i2 ... pj ..." before each step's
  backward (so a worker killed or frozen inside the step's allreduce has
  logged it): the sample indices of its batch, "p" marking the samples that
  pad the epoch's end to a multiple of the world size.

ddp_elastic_check.py replays these logs: it keeps the steps the world
committed, checks that every sample of every epoch was trained on exactly
once (the padding apart), and trains a one-process reference on the same
steps against the parameters rank 0 saved here at the end. Each rank prints
its first commit in each world with the time (for the recovery benchmark),
checks at the end that its parameters equal rank 0's, and prints
"PASS rank R of N".
"""

import argparse
import hashlib
import logging
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import gorovod.torch.distributed.elastic as elastic
from ddp_elastic_check import dataset, make_model, make_optimizer

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=2400)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--step-seconds", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gorovod")
torch.set_num_threads(1)
if os.environ.get("DDP_ELASTIC_DEBUG"):
    logging.basicConfig(level=logging.DEBUG, format="%(created).6f %(name)s %(message)s")


data = dataset(args.samples)
sampler = elastic.ElasticSampler(data, shuffle=True, seed=3)
loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
model = make_model()
optimizer = make_optimizer(model)
log = open(os.path.join(os.environ["ELASTIC_LOG_DIR"], "%d.log" % os.getpid()), "a")
wraps = []  # the world size of each DDP module made


def on_wrap(ddp):
    # DDP's own allreduce hook (the same math as without a hook), registered
    # on each new DDP module, as a script would register its comm hook.
    ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    wraps.append(dist.get_world_size())


state = elastic.State(model, optimizer, sampler, ddp_kwargs=dict(bucket_cap_mb=1, broadcast_buffers=False),
                      on_wrap=on_wrap, epoch=0, steps=0)


def world():
    return dist.group.WORLD.world


def reset_seen():
    if dist.get_rank() == 0:
        print("reset callback at %.6f" % time.time(), flush=True)


state.register_reset_callbacks([reset_seen])


@elastic.run
def train(state):
    if dist.get_rank() == 0:
        print("synced in world %d (size %d) at %.6f" % (world(), dist.get_world_size(), time.time()), flush=True)
    log.write("R %d %d %d\n" % (world(), sampler.epoch, sampler.processed_num))
    log.flush()
    first = True
    for state.epoch in range(state.epoch, args.epochs):
        sampler.set_epoch(state.epoch)
        r, n, left = sampler.rank, sampler.num_replicas, len(sampler.remaining_indices)
        taken = 0  # samples of this rank's share yielded so far
        for idx, x, y in loader:
            marks = []
            for i in idx.tolist():
                marks.append(("p%d" if r + taken * n >= left else "%d") % i)
                taken += 1
            log.write("S %d %d %d %d %d %s\n" % (world(), state.epoch, sampler.processed_num, dist.get_rank(),
                                                 dist.get_world_size(), " ".join(marks)))
            log.flush()
            optimizer.zero_grad()
            F.mse_loss(state.model(x), y).backward()
            optimizer.step()
            sampler.record_batch(0, args.batch_size)
            state.steps += 1
            if state.steps % 10 == 0:
                print("step %d epoch %d world %d rank %d" % (state.steps, state.epoch, dist.get_world_size(),
                                                             dist.get_rank()), flush=True)
            time.sleep(args.step_seconds)
            state.commit()
            if first:
                print("first commit in world %d (size %d rank %d) at %.6f" % (world(), dist.get_world_size(),
                                                                            dist.get_rank(), time.time()), flush=True)
                first = False
        state.commit()


def params(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


if __name__ == "__main__":
    train(state)
    flat = params(model)
    root = flat.clone()
    dist.broadcast(root, 0)
    assert torch.equal(flat, root), "parameters differ from rank 0's"
    # Each world's DDP module was made with ddp_kwargs and given the hook.
    assert state.model.process_group is dist.group.WORLD and not state.model.broadcast_buffers
    assert state.model.bucket_bytes_cap == 1024 * 1024, state.model.bucket_bytes_cap
    assert wraps and wraps[-1] == dist.get_world_size(), wraps
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), os.path.join(os.environ["ELASTIC_LOG_DIR"], "final.pt"))
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    print("rank %d: params_sha256 %s; %d steps" % (dist.get_rank(), digest, state.steps), flush=True)
    print("PASS rank %d of %d" % (dist.get_rank(), dist.get_world_size()), flush=True)
    dist.destroy_process_group()
    sys.exit(0)
