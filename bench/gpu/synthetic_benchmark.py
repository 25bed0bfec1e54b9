#!/usr/bin/env python3
"""Synthetic training benchmark in the style of Horovod's
examples/pytorch/pytorch_synthetic_benchmark.py, on gorovod.torch: a
torchvision model (resnet50 by default) trained on random images with
DistributedOptimizer (fp16 compression with --fp16-allreduce), the
parameters and optimizer state broadcast from rank 0, BatchNorm layers
replaced by gorovod's SyncBatchNorm (--no-sync-bn keeps torch's), one
process per worker under ``gorovod run``:

  gorovod run --np 2 -- python3 bench/gpu/synthetic_benchmark.py --fp16-allreduce

Prints Horovod's lines (img/sec per iteration, per device and in total) and,
from rank 0, one JSON line ({"kind": "synthetic", ...}) on stdout and
appended to --json-out. --cpu runs on CPU tensors (with a small model and
images, e.g. --model resnet18 --image-size 32, to check it where there is no
GPU).
"""

import argparse
import json
import statistics
import sys
import timeit

import torch
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import gorovod.torch as hvd


def parser(description):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", default=False,
                   help="use fp16 compression during allreduce")
    p.add_argument("--model", type=str, default="resnet50", help="model to benchmark (a torchvision.models name)")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size")
    p.add_argument("--image-size", type=int, default=224, help="height and width of the random images")
    p.add_argument("--num-classes", type=int, default=1000, help="classes of the model's output")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches that don't count")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-sync-bn", action="store_true", default=False,
                   help="keep torch's BatchNorm (default: gorovod's SyncBatchNorm)")
    p.add_argument("--cpu", "--no-cuda", dest="cpu", action="store_true", default=False,
                   help="train on the CPU")
    p.add_argument("--json-out", default="", help="a file rank 0 appends its JSON lines to")
    return p


def convert_sync_batchnorm(module):
    """module with every BatchNorm layer replaced by hvd.SyncBatchNorm
    holding the same parameters and running statistics."""
    out = module
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        out = hvd.SyncBatchNorm(module.num_features, eps=module.eps, momentum=module.momentum,
                                affine=module.affine, track_running_stats=module.track_running_stats)
        if module.affine:
            with torch.no_grad():
                out.weight.copy_(module.weight)
                out.bias.copy_(module.bias)
        if module.track_running_stats:
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child))
    return out


def setup(args):
    """hvd.init, the device, and the model, optimizer, data and one training
    step, as Horovod's script makes them. Returns (model, optimizer, step,
    device_name)."""
    hvd.init()
    cuda = not args.cpu and torch.cuda.is_available()
    if not args.cpu and not cuda:
        raise SystemExit("no CUDA device (torch.cuda.is_available() is False); use --cpu")
    if cuda:
        # Horovod: pin the GPU to the local rank (several workers share it when there is one GPU).
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(max(1, torch.get_num_threads() // max(1, hvd.local_size())))

    torch.manual_seed(0)
    model = getattr(models, args.model)(num_classes=args.num_classes)
    if not args.no_sync_bn:
        # torch's name for the conversion, where gorovod's SyncBatchNorm defines one; else this script's.
        convert = convert_sync_batchnorm
        if "convert_sync_batchnorm" in vars(hvd.SyncBatchNorm):
            convert = hvd.SyncBatchNorm.convert_sync_batchnorm
        model = convert(model)
        left = [type(m).__name__ for m in model.modules()
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, hvd.SyncBatchNorm)]
        if left:
            raise SystemExit("BatchNorm layers left after the SyncBatchNorm conversion: %s" % sorted(set(left)))
    lr_scaler = hvd.size()
    if cuda:
        model.cuda()
    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    # Random data, the same every step (as Horovod's script).
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.LongTensor(args.batch_size).random_() % args.num_classes
    if cuda:
        data, target = data.cuda(), target.cuda()

    def step():
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    device = "GPU" if cuda else "CPU"
    return model, optimizer, step, sync, device


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


def emit(args, obj):
    """Rank 0: the JSON line on stdout and appended to --json-out."""
    if hvd.rank() != 0:
        return
    line = json.dumps(obj)
    print(line, flush=True)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(line + "\n")


def main():
    args = parser("PyTorch synthetic benchmark on gorovod").parse_args()
    model, optimizer, step, sync, device = setup(args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def timed(number):
        sync()
        t = timeit.timeit(step, number=number)
        sync()  # the last step's kernels: part of its time
        return t

    log("Model: %s" % args.model)
    log("Batch size: %d" % args.batch_size)
    log("Number of %ss: %d" % (device, hvd.size()))
    log("SyncBatchNorm: %s, fp16 allreduce: %s" % (not args.no_sync_bn, args.fp16_allreduce))

    log("Running warmup...")
    warm = timed(args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timed(args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)

    img_sec_mean = statistics.mean(img_secs)
    img_sec_conf = 1.96 * statistics.pstdev(img_secs)  # numpy.std's (population)
    log("Img/sec per %s: %.1f +-%.1f" % (device, img_sec_mean, img_sec_conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" % (hvd.size(), device, hvd.size() * img_sec_mean,
                                                    hvd.size() * img_sec_conf))
    emit(args, {"kind": "synthetic", "source": "synthetic_benchmark", "model": args.model,
                "batch_size": args.batch_size, "image_size": args.image_size, "device": device,
                "world": hvd.size(), "sync_bn": not args.no_sync_bn, "fp16_allreduce": args.fp16_allreduce,
                "warmup_batches": args.num_warmup_batches, "warmup_s": warm,
                "batches_per_iter": args.num_batches_per_iter, "iters": args.num_iters,
                "img_sec_per_device": img_sec_mean, "img_sec_per_device_conf": img_sec_conf,
                "img_sec_total": hvd.size() * img_sec_mean, "img_sec_iters": img_secs})
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
