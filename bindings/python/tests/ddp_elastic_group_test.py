"""dist.new_group across an elastic DDP job's world changes: the function
elastic.run wraps makes, each time it starts (in every world, on every
worker, one that joined too), the group of every rank but the last of the
current world; each step its members all_reduce on it (checked against the
sum of their ranks), then the world trains a DDP step. A world change
destroys the old world's groups: on entry the script checks that a
collective on each group it made before raises RuntimeError naming the
world change.

Prints "step S world W rank R" every 10 steps, then, on every rank, "PASS
rank R of N" once the final world's parameters are the same on every rank.
Driven by bindings/python/ddp_elastic_test.go (TestDDPElasticNewGroup),
which kills a worker mid-training. With --die-before-new-group N, the last
rank of a world of N ranks kills itself (SIGKILL) just before its
new_group, after printing "rank R of N dies before new_group": the others
are then waiting for it in new_group's set-up, whose timeout
--group-timeout gives (seconds). With --leave-before-new-group N, that rank
instead leaves the job gracefully (it shuts gorovod down, not reporting
training finished, and exits with status 0) after printing "rank R of N
leaves before new_group".
"""

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.distributed_c10d import GroupMember

import gorovod.torch.distributed.elastic as elastic
from gorovod import _core

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--step-seconds", type=float, default=0.05)
parser.add_argument("--die-before-new-group", type=int, default=0)
parser.add_argument("--leave-before-new-group", type=int, default=0)
parser.add_argument("--group-timeout", type=float, default=None)
args = parser.parse_args()

dist.init_process_group("gorovod")
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.State(model, optimizer, steps=0)
earlier = []  # the groups this worker was a member of in earlier worlds
refused = []  # how many of them refused a collective, per world


@elastic.run
def train(state):
    r, n = dist.get_rank(), dist.get_world_size()
    stale = 0
    for old in earlier:
        try:
            dist.all_reduce(torch.zeros(1), group=old)
        except (RuntimeError, TypeError) as e:
            # torch 2.x's c10d logger, which wraps dist.all_reduce, asks
            # torch's bookkeeping for the group's backend when a collective
            # raises, and its lookup of a group of a destroyed world raises
            # TypeError ("value was None") in turn, with the backend's error
            # as its context.
            why = e if isinstance(e, RuntimeError) else e.__context__
            if "world" not in str(why) or "new_group" not in str(why):
                raise AssertionError("rank %d: an old world's group raised %r, want the world change named" % (r, e))
            stale += 1
        else:
            raise AssertionError("rank %d: a group of an earlier world ran a collective in world of %d" % (r, n))
    refused.append(stale)
    ranks = list(range(max(n - 1, 1)))
    if n == args.die_before_new_group and r == n - 1:
        print("rank %d of %d dies before new_group" % (r, n), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if n == args.leave_before_new_group and r == n - 1:
        print("rank %d of %d leaves before new_group" % (r, n), flush=True)
        _core.shutdown(finished=False)
        os._exit(0)
    timeout = {} if args.group_timeout is None else {"timeout": datetime.timedelta(seconds=args.group_timeout)}
    group = dist.new_group(ranks=ranks, **timeout)
    if r in ranks:
        earlier.append(group)
    elif group is not GroupMember.NON_GROUP_MEMBER:
        raise AssertionError("rank %d: got %r for a group of ranks %s" % (r, group, ranks))
    while state.steps < args.steps:
        if r in ranks:
            t = torch.tensor([float(r + 1)])
            dist.all_reduce(t, group=group)
            if t.item() != sum(q + 1 for q in ranks):
                raise AssertionError("rank %d: group %s summed %s" % (r, ranks, t.item()))
        g = torch.Generator().manual_seed(state.steps * 100 + r)
        x = torch.randn(4, 2, generator=g)
        optimizer.zero_grad()
        F.mse_loss(state.model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
        state.steps += 1
        if state.steps % 10 == 0:
            print("step %d world %d rank %d" % (state.steps, n, r), flush=True)
        time.sleep(args.step_seconds)
        state.commit()


train(state)
r, n = dist.get_rank(), dist.get_world_size()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(n)]
dist.all_gather(everyone, flat)
for q in range(n):
    if not torch.equal(everyone[q], flat):
        raise AssertionError("rank %d: rank %d ended with other parameters" % (r, q))
# Each world's entry checked every group this worker had been a member of
# (each refused, or the entry raised); the Go test counts them.
print("refused %s rank %d" % (refused, r), flush=True)
print("PASS rank %d of %d" % (r, n), flush=True)
