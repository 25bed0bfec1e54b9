#!/usr/bin/env python3
"""The elastic version of synthetic_benchmark.py, in the style of Horovod's
examples/pytorch/pytorch_synthetic_benchmark_elastic.py: the same model,
data and DistributedOptimizer (see synthetic_benchmark.py for the flags),
trained inside ``hvd.elastic.run`` with a ``hvd.elastic.TorchState``
committed every --batches-per-commit batches, so that the job goes on when
workers die or join:

  gorovod run --np 2 --min-np 1 --max-np 2 -- python3 bench/gpu/elastic_synthetic.py --fp16-allreduce

Rank 0 prints, for each benchmark iteration, Horovod's line with the world
size added ("Iter #3: 812.4 img/sec per GPU, world 2, 40 batches") and
appends JSON lines to --json-out (and prints them):

  {"kind": "elastic_iter", ...}   iter, world, img_sec_per_device, img_sec_total
                                  (world * per device), batches (committed so
                                  far), time (Unix seconds)
  {"kind": "elastic_reset", ...}  a reset after a world change: the new world,
                                  time, resets so far
  {"kind": "elastic_done", ...}   the end: iterations, batches, resets, and
                                  the mean img/sec per world size

bench/gpu/run.sh starts it at --np 2 and kills one worker with kill -9
after a few iterations: the survivor restores the last commit and finishes
the remaining iterations alone.
"""

import statistics
import sys
import time
import timeit

import gorovod.torch as hvd

from synthetic_benchmark import emit, log, parser, setup


def main():
    p = parser("PyTorch synthetic benchmark on gorovod, elastic")
    p.add_argument("--batches-per-commit", type=int, default=1, help="commit the state every this many batches")
    args = p.parse_args()
    model, optimizer, step, sync, device = setup(args)

    state = hvd.elastic.TorchState(model, optimizer, iter=0, batch=0, warm=False, img_secs=[])
    resets = [0]  # this process's count (not state: a restore would take it back)

    def on_state_reset():
        # As Horovod's example: the learning rate follows the world size.
        for group in optimizer.param_groups:
            group["lr"] = 0.01 * hvd.size()
        resets[0] += 1
        emit(args, {"kind": "elastic_reset", "source": "elastic_synthetic", "world": hvd.size(),
                    "resets": resets[0], "iter": state.iter, "batches": state.batch, "time": time.time()})
        log("Reset: world %d, resuming at iter #%d, %d batches committed" % (hvd.size(), state.iter, state.batch))

    state.register_reset_callbacks([on_state_reset])

    def batch():
        step()
        state.batch += 1
        if state.batch % args.batches_per_commit == 0:
            state.commit()

    def timed(number):
        sync()
        t = timeit.timeit(batch, number=number)
        sync()
        return t

    @hvd.elastic.run
    def run_benchmark(state):
        if not state.warm:
            log("Model: %s, batch size %d, %d %s(s), SyncBatchNorm %s, fp16 allreduce %s" %
                (args.model, args.batch_size, hvd.size(), device, not args.no_sync_bn, args.fp16_allreduce))
            log("Running warmup...")
            timed(args.num_warmup_batches)
            state.warm = True
            state.commit()
            log("Running benchmark...")
        while state.iter < args.num_iters:
            world = hvd.size()
            t = timed(args.num_batches_per_iter)
            img_sec = args.batch_size * args.num_batches_per_iter / t
            state.img_secs.append([world, img_sec])
            state.iter += 1
            state.commit()
            log("Iter #%d: %.1f img/sec per %s, world %d, %d batches" %
                (state.iter - 1, img_sec, device, world, state.batch))
            emit(args, {"kind": "elastic_iter", "source": "elastic_synthetic", "iter": state.iter - 1,
                        "world": world, "img_sec_per_device": img_sec, "img_sec_total": world * img_sec,
                        "batches": state.batch, "time": time.time()})

    start = time.time()
    run_benchmark(state)
    by_world = {}
    for world, img_sec in state.img_secs:
        by_world.setdefault(world, []).append(img_sec)
    for world in sorted(by_world, reverse=True):
        per = statistics.mean(by_world[world])
        log("World %d: %d iters, img/sec per %s: %.1f, total: %.1f" %
            (world, len(by_world[world]), device, per, world * per))
    emit(args, {"kind": "elastic_done", "source": "elastic_synthetic", "model": args.model,
                "batch_size": args.batch_size, "device": device, "final_world": hvd.size(), "iters": state.iter,
                "batches": state.batch, "resets": resets[0], "seconds": time.time() - start,
                "img_sec_per_device_by_world": {str(w): statistics.mean(v) for w, v in by_world.items()},
                "img_sec_total_by_world": {str(w): w * statistics.mean(v) for w, v in by_world.items()}})
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
