"""Interleaved comparison of gorovod.torch and DDP-Gloo (train_bench.py):
for each repeat, each process count and model, both backends run back to
back (their order alternating between repeats); prints every run and the
medians, min and max of steps/s and of the ratio gorovod / DDP per repeat,
and the same of rank 0's CPU time per step.

    GOROVOD=<path to the gorovod command> GOROVOD_LIBRARY=<libgorovod.so> \
      PYTHONPATH=bindings/python /usr/bin/python3 bindings/python/bench/compare.py --repeats 5

The workers run /usr/bin/python3, or the Python that PYTHON names.

--ceiling also runs train_bench.py's "alone" backend in each repeat (the same
processes with no gradient exchange) and prints what it bounds: alone / DDP
is the most any backend could be ahead of DDP-Gloo on this machine, and
gorovod / alone how much of that gorovod reaches.

It first prints what bounds the compute on this machine: torch's version, the
BLAS library its matrix products run in, and one thread's float32 matrix
product rate. A step's compute sets how much the exchange can weigh, so
ratios taken with different BLAS libraries are not comparable; Debian's
python3-torch installed without recommends runs on the reference BLAS
(libblas3, a few GFLOP/s), not OpenBLAS (`apt-get install
libopenblas0-pthread`).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "train_bench.py")
# The Python that runs the workers (PYTHON, as bench/gpu/run.sh gives it; Debian's by default).
PY = os.environ.get("PYTHON", "/usr/bin/python3")


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
    if backend in ("gorovod", "alone", "ddp-gorovod"):
        argv = [os.environ.get("GOROVOD", "gorovod"), "run", "--np", str(np), "--min-np", str(np), "--", PY, BENCH] + common
    else:
        argv = [PY, BENCH, "--np", str(np)] + common
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600).stdout.decode()
    m = re.search(r"RESULT \S+ \S+ (\d+) ([0-9.]+) cpu_ms_per_step ([0-9.]+)", out)
    if not m:
        return None, None, out
    return float(m.group(2)), float(m.group(3)), out


MACHINE = r"""
import re, time, torch
torch.set_num_threads(1)
a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
torch.mm(a, b)
t = time.perf_counter()
for _ in range(10):
    torch.mm(a, b)
rate = 10 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9
libs = sorted({m.group(1) for m in re.finditer(r"(/\S*(?:blas|mkl)\S*\.so[.0-9]*)", open("/proc/self/maps").read()) if "lapack" not in m.group(1)})
print("torch %s; BLAS: %s; one thread's 1024x1024 float32 matmul: %.1f GFLOP/s" % (
    torch.__version__, ", ".join(libs) or "none found", rate))
"""


def machine():
    """One line on what bounds a step's compute here (see the docstring),
    from a separate process with OMP_NUM_THREADS=1 as the workers run."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([PY, "-c", MACHINE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         timeout=120).stdout.decode().strip()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return "%s; load average %s" % (out.splitlines()[-1] if out else "torch not found", load)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--np", default="2,4")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--ceiling", action="store_true", help="also run each model without gradient exchange")
    p.add_argument("--ddp-gorovod", action="store_true",
                   help="also run DistributedDataParallel on torch.distributed's backend \"gorovod\"")
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per run for every model (default: mlp 20, cnn 60)")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed steps before them for every model (default: mlp 3, cnn 5)")
    args = p.parse_args()
    print(machine(), flush=True)
    steps = {"mlp": (20, 3), "cnn": (60, 5)}
    for model, (n, w) in steps.items():
        steps[model] = (args.steps or n, args.warmup or w)
    results, cpus = {}, {}
    for rep in range(args.repeats):
        for np in [int(n) for n in args.np.split(",")]:
            for model in args.models.split(","):
                order = ["gorovod", "ddp"] + (["alone"] if args.ceiling else []) + \
                    (["ddp-gorovod"] if args.ddp_gorovod else [])
                if rep % 2:
                    order.reverse()
                for backend in order:
                    rate, cpu = run(backend, model, np, *steps[model])
                    results.setdefault((model, np, backend), []).append(rate)
                    cpus.setdefault((model, np, backend), []).append(cpu)
                    print("repeat %d %s np=%d %s: %.3f steps/s, rank 0 %.2f ms CPU per step" % (
                        rep, model, np, backend, rate, cpu), flush=True)
    models, nps = args.models.split(","), [int(n) for n in args.np.split(",")]
    print()
    table(results, models, nps, "gorovod steps/s", "DDP-Gloo steps/s", "ratio", "%.2f", lambda g, d: g / d)
    print()
    print("CPU time per step of rank 0's process (every thread), ms: on a machine whose cores the workers fill, "
          "steps/s goes as its inverse")
    print()
    table(cpus, models, nps, "gorovod", "DDP-Gloo", "DDP / gorovod", "%.1f", lambda g, d: d / g)
    if args.ddp_gorovod:
        print()
        print("DistributedDataParallel, the same script on backend \"gorovod\" against \"gloo\"")
        print()
        table(results, models, nps, "DDP-gorovod steps/s", "DDP-Gloo steps/s", "ratio", "%.2f", lambda g, d: g / d,
              first="ddp-gorovod")
    if args.ceiling:
        print()
        print("Without gradient exchange (the same processes, each training its own replica): the ceiling")
        print()
        table(results, models, nps, "alone steps/s", "DDP-Gloo steps/s", "ceiling alone / DDP", "%.2f",
              lambda a, d: a / d, first="alone")
        print()
        table(results, models, nps, "gorovod steps/s", "alone steps/s", "gorovod / alone", "%.2f",
              lambda g, a: g / a, second="alone")


def table(values, models, nps, gorovod, ddp, ratio, fmt, ratio_of, first="gorovod", second="ddp"):
    """A markdown table: per model and np, two backends' medians (min-max)
    (first and second, by default gorovod and DDP) and the median (min-max)
    of ratio_of(first, second) per repeat."""
    def spread(v, f):
        return ("%s (%s-%s)" % (f, f, f)) % (statistics.median(v), min(v), max(v))
    print("| model | np | %s (median, min-max) | %s (median, min-max) | %s (median, min-max) |" % (gorovod, ddp, ratio))
    print("|---|---|---|---|---|")
    for model in models:
        for np in nps:
            g, d = values[(model, np, first)], values[(model, np, second)]
            ratios = [ratio_of(a, b) for a, b in zip(g, d)]
            print("| %s | %d | %s | %s | %s |" % (model, np, spread(g, fmt), spread(d, fmt), spread(ratios, "%.2f")))

if __name__ == "__main__":
    main()
