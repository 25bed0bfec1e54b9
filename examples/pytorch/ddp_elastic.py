"""examples/pytorch/ddp_train.py made elastic: the same DistributedDataParallel
training, which goes on in place when workers die (kill -9), freeze
(SIGSTOP), leave (SIGTERM) or join (kill -USR1 of `gorovod run`), with
gorovod.torch.distributed.elastic:

    gorovod run --np 4 --min-np 1 --max-np 4 -- python examples/pytorch/ddp_elastic.py

What differs from ddp_train.py: the import; ElasticSampler for
DistributedSampler; the module is given to elastic.State, which wraps it in
DDP for each world (state.model); the loop is in a function under
@elastic.run, which records each batch with the sampler and commits.

With --cuda each worker trains on its GPU (local rank modulo the GPUs it
sees), DDP wrapping the module with device_ids (elastic.State's ddp_kwargs).

Rank 0 prints the loss at the end of each epoch and every rank, at the end,
a digest of the parameters, which is the same on every rank.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import gorovod.torch.distributed.elastic as elastic  # registers the "gorovod" backend too


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cuda", action="store_true", help="train on this worker's GPU")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gorovod")
    device, ddp_kwargs = torch.device("cpu"), {}
    if args.cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        ddp_kwargs = {"device_ids": [device.index]}

    # The same synthetic data set on every rank: y = x·w + noise.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(4096, 1, generator=g)
    sampler = elastic.ElasticSampler(TensorDataset(x, y), shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = elastic.State(model, opt, sampler, ddp_kwargs=ddp_kwargs, epoch=0)

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            sampler.set_epoch(state.epoch)
            loss = None
            for step, (xb, yb) in enumerate(loader):
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(state.model(xb), yb)
                loss.backward()
                opt.step()
                sampler.record_batch(step, args.batch_size)
                state.commit()
            if dist.get_rank() == 0 and loss is not None:
                print("epoch %d: loss %.4f (rank %d of %d)" % (state.epoch + 1, loss.item(), dist.get_rank(),
                                                               dist.get_world_size()), flush=True)

    train(state)
    digest = hashlib.sha256(b"".join(q.detach().cpu().numpy().tobytes() for q in model.parameters())).hexdigest()
    print("rank %d: params_sha256 %s" % (dist.get_rank(), digest), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
