"""A torchrun-style DistributedDataParallel script: a small MLP on a synthetic
regression task, on any torch.distributed backend.

On gorovod, in the environment `pip install ./bindings/python` installed
into (the installed package registers the backend in `gorovod run`'s
workers; `gorovod run` gives the rest):

    gorovod run --np 2 -- python examples/pytorch/ddp_train.py --backend gorovod

On Gloo, under torchrun or with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set by hand:

    torchrun --nproc_per_node 2 examples/pytorch/ddp_train.py --backend gloo

With --cuda each worker trains on its GPU (local rank modulo the GPUs it
sees), as GPU DDP scripts do: the model and batches on the device,
DistributedDataParallel(model, device_ids=[device]).

Rank 0 prints the loss every few steps and, at the end, a digest of the
parameters, which is the same on every rank.
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cuda", action="store_true", help="train on this worker's GPU")
    args = p.parse_args()
    if args.backend == "gorovod":
        # Needed only where gorovod is not installed (run from a checkout
        # with PYTHONPATH=bindings/python): registers the backend.
        import gorovod.torch.distributed  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun, and by init_process_group("gorovod")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)

    # The same synthetic data set on every rank: y = x·w + noise.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(4096, 1, generator=g)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if args.cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:
            print("epoch %d: loss %.4f (rank %d of %d, local rank %d)" % (epoch + 1, loss.item(), rank, world,
                                                                          local_rank), flush=True)
    digest = hashlib.sha256(b"".join(q.detach().cpu().numpy().tobytes() for q in model.parameters())).hexdigest()
    print("rank %d: params_sha256 %s" % (rank, digest), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
