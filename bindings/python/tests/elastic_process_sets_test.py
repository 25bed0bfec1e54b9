"""Process sets across an elastic job's world changes, as a Horovod elastic
script keeps them: the function elastic.run wraps adds, each time it starts
(every worker runs it after each reset, one that joined too), the set of
every rank but the last of the current world; each step its members
allreduce on it, then the world trains a step. A world change removes the
sets of the old world: on entry the script checks that the sets it added
before are gone (their size() raises ValueError) before it adds the new
one, whose id is above theirs.

Prints "step S world W rank R set ID" every 10 steps and "PASS rank R of
N" at the end. Driven by bindings/python/elastic_test.go
(TestElasticProcessSets), which kills a worker mid-training.
"""

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import gorovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--step-seconds", type=float, default=0.05)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(1, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
earlier = []  # the sets this worker added in earlier worlds


@hvd.elastic.run
def train(state):
    n = hvd.size()
    for ps in earlier:
        try:
            ps.size()
        except ValueError:
            continue
        raise AssertionError("%s outlived the world it was made in" % ps)
    ps = hvd.add_process_set(list(range(max(n - 1, 1)))) if n > 1 else None
    if ps is not None:
        assert all(ps.process_set_id > old.process_set_id for old in earlier), (ps, earlier)
        earlier.append(ps)
    while state.steps < args.steps:
        if ps is not None and ps.included():
            s = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps)
            assert s.item() == n - 1, "sum on %s: %s" % (ps, s)
        x = torch.full((4, 1), float(state.steps % 7))
        state.optimizer.zero_grad()
        F.mse_loss(state.model(x), x * 0.5).backward()
        state.optimizer.step()
        state.steps += 1
        if state.steps % 10 == 0:
            print("step %d world %d rank %d set %d" % (state.steps, n, hvd.rank(),
                                                       -1 if ps is None else ps.process_set_id), flush=True)
        time.sleep(args.step_seconds)
        state.commit()


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, steps=0)
train(state)

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
root = hvd.broadcast(flat, 0)
assert torch.equal(flat, root), "parameters differ from rank 0's"
print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
hvd.shutdown()
sys.exit(0)
