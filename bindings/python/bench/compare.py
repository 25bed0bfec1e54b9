"""Interleaved comparison of gorovod.torch and DDP-Gloo (train_bench.py):
for each repeat, each process count and model, both backends run back to
back (their order alternating between repeats); prints every run and the
medians, min and max of steps/s and of the ratio gorovod / DDP per repeat,
and the same of rank 0's CPU time per step.

    GOROVOD=<path to the gorovod command> GOROVOD_LIBRARY=<libgorovod.so> \
      PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench/compare.py --repeats 5
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "train_bench.py")
PY = "/usr/bin/python3"


def run(backend, model, np, steps, warmup, tries=3):
    """steps/s of one run; a run that fails is tried again (on an overloaded
    machine gossip can declare a starved worker dead, which fails a
    non-elastic script), and the retries are reported."""
    for attempt in range(tries):
        rate, cpu, out = run_once(backend, model, np, steps, warmup)
        if rate is not None:
            return rate, cpu
        print("run failed (attempt %d of %d): %s" % (attempt + 1, tries, out.strip().splitlines()[-1:]), flush=True)
    sys.exit("%s %s np=%d failed %d times" % (backend, model, np, tries))


def run_once(backend, model, np, steps, warmup):
    common = ["--backend", backend, "--model", model, "--steps", str(steps), "--warmup", str(warmup)]
    if backend == "gorovod":
        argv = [os.environ.get("GOROVOD", "gorovod"), "run", "--np", str(np), "--min-np", str(np), "--", PY, BENCH] + common
    else:
        argv = [PY, BENCH, "--np", str(np)] + common
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600).stdout.decode()
    m = re.search(r"RESULT \S+ \S+ (\d+) ([0-9.]+) cpu_ms_per_step ([0-9.]+)", out)
    if not m:
        return None, None, out
    return float(m.group(2)), float(m.group(3)), out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--np", default="2,4")
    p.add_argument("--models", default="mlp,cnn")
    args = p.parse_args()
    steps = {"mlp": (20, 3), "cnn": (60, 5)}
    results, cpus = {}, {}
    for rep in range(args.repeats):
        for np in [int(n) for n in args.np.split(",")]:
            for model in args.models.split(","):
                order = ["gorovod", "ddp"] if rep % 2 == 0 else ["ddp", "gorovod"]
                for backend in order:
                    rate, cpu = run(backend, model, np, *steps[model])
                    results.setdefault((model, np, backend), []).append(rate)
                    cpus.setdefault((model, np, backend), []).append(cpu)
                    print("repeat %d %s np=%d %s: %.3f steps/s, rank 0 %.2f ms CPU per step" % (
                        rep, model, np, backend, rate, cpu), flush=True)
    print()
    print("| model | np | gorovod steps/s (median, min-max) | DDP-Gloo steps/s (median, min-max) | ratio (median, min-max) |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        for np in [int(n) for n in args.np.split(",")]:
            g, d = results[(model, np, "gorovod")], results[(model, np, "ddp")]
            ratios = [a / b for a, b in zip(g, d)]
            print("| %s | %d | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) |" % (
                model, np, statistics.median(g), min(g), max(g), statistics.median(d), min(d), max(d),
                statistics.median(ratios), min(ratios), max(ratios)))
    print()
    print("CPU time per step of rank 0's process (every thread), ms: on a machine whose cores the workers fill, "
          "steps/s goes as its inverse")
    print()
    print("| model | np | gorovod (median, min-max) | DDP-Gloo (median, min-max) | DDP / gorovod (median, min-max) |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        for np in [int(n) for n in args.np.split(",")]:
            g, d = cpus[(model, np, "gorovod")], cpus[(model, np, "ddp")]
            ratios = [b / a for a, b in zip(g, d)]
            print("| %s | %d | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.2f (%.2f-%.2f) |" % (
                model, np, statistics.median(g), min(g), max(g), statistics.median(d), min(d), max(d),
                statistics.median(ratios), min(ratios), max(ratios)))


if __name__ == "__main__":
    main()
