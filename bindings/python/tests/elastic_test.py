"""Elastic training through gorovod.torch.elastic: run, TorchState,
ElasticSampler, while the Go test kills, adds or removes workers.

Every worker appends, before each step's gradient allreduce, the data
epoch and the sample indices of its batch to its own log file in
$ELASTIC_LOG_DIR; the test checks that every sample of every epoch was
trained on (none lost across world changes). Each step sleeps a little
(--step-seconds) so that the test can change the world mid-epoch. At the end
each worker checks that its parameters equal rank 0's and prints
"PASS rank R of N".
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import gorovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=1200)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--step-seconds", type=float, default=0.05)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)

data = torch.arange(args.samples, dtype=torch.float32).unsqueeze(1)
targets = (data * 0.5 + 1.0) / args.samples
dataset = torch.utils.data.TensorDataset(torch.arange(args.samples), data / args.samples, targets)
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

model = torch.nn.Linear(1, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
log = open(os.path.join(os.environ["ELASTIC_LOG_DIR"], "%d.log" % os.getpid()), "a")
resets = []


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs):
        state.train_sampler.set_epoch(state.epoch)
        for idx, x, y in loader:
            # Logged before the step's allreduce: a worker frozen or killed
            # after its gradient went into the allreduce has trained on the
            # batch even though it never returns from step(). A step that
            # fails is rolled back and its samples trained again (repeats).
            log.write("%d %s\n" % (state.epoch, " ".join(str(i) for i in idx.tolist())))
            log.flush()
            state.optimizer.zero_grad()
            F.mse_loss(state.model(x), y).backward()
            state.optimizer.step()
            state.train_sampler.record_batch(0, args.batch_size)
            state.steps += 1
            if state.steps % 10 == 0:
                print("step %d epoch %d world %d rank %d" % (state.steps, state.epoch, hvd.size(), hvd.rank()),
                      flush=True)
            time.sleep(args.step_seconds)
            state.commit()
        state.commit()


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, train_sampler=sampler, epoch=0, steps=0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
train(state)

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
root = hvd.broadcast(flat, 0)
assert torch.equal(flat, root), "parameters differ from rank 0's"
print("resets seen: %s; steps %d" % (resets, state.steps), flush=True)
print("PASS rank %d of %d" % (hvd.rank(), hvd.size()), flush=True)
hvd.shutdown()
sys.exit(0)
