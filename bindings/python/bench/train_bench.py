"""Training steps per second of one model, data-parallel, under gorovod.torch
(run it under `gorovod run`) or under torch's DistributedDataParallel with
the Gloo backend (it spawns the processes itself). CPU only, synthetic data,
torch.set_num_threads(1) in every process and OMP_NUM_THREADS (which also
sizes OpenBLAS's own thread pool) set as the launchers set it (torchrun: 1;
`gorovod run`: the host's CPUs divided among the workers); the same model,
batch and optimizer either way. Prints one line: "RESULT backend model np steps/s".

    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bench/train_bench.py --backend gorovod --model mlp
    /usr/bin/python3 bench/train_bench.py --backend ddp --np 2 --model mlp
    gorovod run --np 2 --min-np 2 -- /usr/bin/python3 bench/train_bench.py --backend ddp-gorovod --model mlp

--backend alone runs the same processes as --backend gorovod (under `gorovod
run`, so with the same placement and thread counts) but without
DistributedOptimizer: each trains its own replica and no gradient is
exchanged. Its steps/s is what the same processes reach on the same cores
with communication for free: the ceiling of any data-parallel backend here.

compare.py interleaves the two and reports medians.
"""

import argparse
import os
import socket
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CNN(nn.Module):
    """examples/pytorch/pytorch_mnist.py's network (about 21 K parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        return F.log_softmax(self.fc2(x), dim=1)


def mlp():
    """A communication-heavy MLP: about 10 M parameters, little compute."""
    return nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10), nn.LogSoftmax(dim=1))


def build(name, batch):
    torch.manual_seed(0)
    if name == "cnn":
        return CNN(), torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    return mlp(), torch.randn(batch, 784), torch.randint(0, 10, (batch,))


def timed_steps(model, opt, x, y, warmup, steps, barrier):
    def step():
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    for _ in range(warmup):
        step()
    barrier()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    barrier()
    # The process's CPU time per step (every thread's: the framework's and
    # the communication library's) is less sensitive to other load on the
    # machine than the wall clock.
    return steps / (time.perf_counter() - start), (time.process_time() - cpu) / steps


def run_gorovod(args):
    import gorovod.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    model, x, y = build(args.model, args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if args.backend == "gorovod":
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    rate, cpu = timed_steps(model, opt, x, y, args.warmup, args.steps, hvd.barrier)
    if hvd.rank() == 0:
        print("RESULT %s %s %d %.3f cpu_ms_per_step %.2f" % (args.backend, args.model, hvd.size(), rate, cpu * 1e3),
              flush=True)
    hvd.shutdown()


def run_ddp_gorovod(args):
    """DistributedDataParallel on torch.distributed's backend "gorovod",
    under `gorovod run`: the script a DDP user runs, backend name changed."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import gorovod.torch.distributed  # noqa: F401 (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("gorovod")
    model, x, y = build(args.model, args.batch_size)
    model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rate, cpu = timed_steps(model, opt, x, y, args.warmup, args.steps, dist.barrier)
    if dist.get_rank() == 0:
        print("RESULT ddp-gorovod %s %d %.3f cpu_ms_per_step %.2f" % (args.model, dist.get_world_size(), rate,
                                                                      cpu * 1e3), flush=True)
    dist.destroy_process_group()


def ddp_worker(rank, args, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=args.np)
    model, x, y = build(args.model, args.batch_size)
    model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rate, cpu = timed_steps(model, opt, x, y, args.warmup, args.steps, dist.barrier)
    if rank == 0:
        print("RESULT ddp %s %d %.3f cpu_ms_per_step %.2f" % (args.model, args.np, rate, cpu * 1e3), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["gorovod", "alone", "ddp", "ddp-gorovod"], required=True)
    p.add_argument("--model", choices=["cnn", "mlp"], default="mlp")
    p.add_argument("--np", type=int, default=2, help="processes (ddp; gorovod takes gorovod run's)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    if args.backend in ("gorovod", "alone"):
        run_gorovod(args)
    elif args.backend == "ddp-gorovod":
        run_ddp_gorovod(args)
    else:
        import torch.multiprocessing as mp
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # As torchrun does for several processes per host (and `gorovod run`
        # does, with the host's CPUs divided among its workers): one OpenMP /
        # OpenBLAS thread per process. The spawned processes read it when
        # they load torch.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.np)))
        mp.spawn(ddp_worker, args=(args, free_port()), nprocs=args.np, join=True)


if __name__ == "__main__":
    main()
