#!/usr/bin/env python3
"""The figures of a bench/gpu/run.sh run, from its bench.jsonl (and the Go
benchmark lines in cuda-tests.txt), as the check asks for them:

- gorovod.torch's allreduce (2 workers on the one GPU): bus bandwidth at 64
  and 256 MiB as a fraction of the device-to-device copy bandwidth measured
  in the same run (torch_baseline.py's copy, bytes copied per second), the
  4 KiB latency, and the ratio to Gloo's time on the same data;
- the same from the Go benchmarks (BenchmarkAllreduceDevice against
  BenchmarkCopyDevice), when they ran;
- the synthetic benchmark's img/s at --np 1 and 2 and their ratio;
- the elastic run: iterations and img/s before and after the kill, and how
  long after the kill the survivor reset and trained again.

Prints plain lines; missing parts are said to be missing. Usage:
  python3 summarize.py --jsonl OUT/bench.jsonl [--gobench OUT/cuda-tests.txt]
"""

import argparse
import json
import re
import statistics
import sys

KIB, MIB = 1024, 1024 * 1024


def size_name(n):
    return "%d MiB" % (n // MIB) if n >= MIB else "%d KiB" % (n // KIB)


def load(path):
    recs = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short
    except OSError as e:
        print("no %s: %s" % (path, e))
    return recs


def allreduce_lines(recs, out):
    copy = {(r["dtype"], r["bytes"]): r["algbw_GBps"] for r in recs
            if r.get("step") == "torch" and r.get("kind") == "copy"}
    gloo = {(r["dtype"], r["bytes"]): r for r in recs
            if r.get("step") == "torch" and r.get("kind") == "allreduce"}
    gor = {}
    for r in recs:
        if r.get("step") == "allreduce" and r.get("kind") == "allreduce":
            gor[(r["dtype"], r["bytes"])] = r  # a size measured twice keeps the later (the staged fallback)
    errs = [r for r in recs if r.get("step") == "allreduce" and r.get("kind") == "error"]
    if not gor:
        out("gorovod.torch allreduce: no measurements%s" %
            ("; first error: %s" % errs[0].get("error", "")[:200] if errs else ""))
        return
    paths = sorted({r["path"] for r in gor.values()})
    out("gorovod.torch allreduce, Average in place, %d workers, path %s (Gloo: torch.distributed, Sum; "
        "copy: dst.copy_(src) on the GPU, bytes/s):" % (next(iter(gor.values()))["world"], "/".join(paths)))
    for (dt, n), r in sorted(gor.items()):
        g = gloo.get((dt, n))
        vs = ("; Gloo %.1f us, %.2f GB/s busbw; Gloo time / gorovod time %.2f" %
              (g["median_s"] * 1e6, g["busbw_GBps"], g["median_s"] / r["median_s"])) if g else "; no Gloo figure"
        frac = ""
        if (dt, n) in copy:
            frac = " = %.4f of the copy's %.1f GB/s" % (r["busbw_GBps"] / copy[(dt, n)], copy[(dt, n)])
        out("  %-8s %-7s %-11s %10.1f us, busbw %8.3f GB/s%s%s%s" %
            (dt, size_name(n), r["path"], r["median_s"] * 1e6, r["busbw_GBps"], frac, vs,
             "" if r.get("warmup_ok", True) else "  WRONG RESULT"))
    if errs:
        out("  errors: %d; first: %s" % (len(errs), errs[0].get("error", "")[:200]))


GOBENCH = re.compile(r"^(Benchmark\w+)/(?:(\w+)/)?(\d+)(KiB|MiB)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:\s+([\d.]+) MB/s)?")


def gobench_lines(path, out):
    try:
        text = open(path).read()
    except OSError:
        return
    res = {}
    for line in text.splitlines():
        m = GOBENCH.match(line.strip())
        if m:
            name, dt, num, unit, ns, mbs = m.groups()
            n = int(num) * (KIB if unit == "KiB" else MIB)
            res[(name, dt or "", n)] = (float(ns), float(mbs) if mbs else None)
    if not res:
        out("Go benchmarks: none in the output")
        return
    out("Go benchmarks (collective/cuda; 2 ranks in one process, in-process transport; GB/s = 10^9 B/s):")
    copies = {n: v[1] for (name, _, n), v in res.items() if name == "BenchmarkCopyDevice" and v[1]}
    for (name, dt, n), (ns, mbs) in sorted(res.items()):
        if name != "BenchmarkAllreduceDevice":
            continue
        frac = ""
        if mbs and copies.get(n):
            frac = " = %.4f of BenchmarkCopyDevice's %.1f GB/s" % (mbs / copies[n], copies[n] / 1e3)
        out("  %s %-8s %-7s %10.1f us, busbw %8.3f GB/s%s" %
            (name, dt, size_name(n), ns / 1e3, (mbs or 0) / 1e3, frac))


def synthetic_lines(recs, out):
    syn = {r["step"]: r for r in recs if r.get("kind") == "synthetic"}
    if not syn:
        out("synthetic benchmark: no results")
        return
    for step in sorted(syn):
        r = syn[step]
        out("synthetic %s: %s, batch %d, %d %s(s), SyncBatchNorm %s, fp16 allreduce %s: %.1f img/s per device "
            "(+-%.1f), %.1f img/s total" % (step, r["model"], r["batch_size"], r["world"], r["device"], r["sync_bn"],
                                           r["fp16_allreduce"], r["img_sec_per_device"],
                                           r["img_sec_per_device_conf"], r["img_sec_total"]))
    if "synth1" in syn and "synth2" in syn:
        a, b = syn["synth1"]["img_sec_total"], syn["synth2"]["img_sec_total"]
        out("synthetic scaling: np 2 total / np 1 total = %.3f (%.1f / %.1f img/s)" % (b / a, b, a))


def elastic_lines(recs, out):
    el = [r for r in recs if r.get("step") == "elastic"]
    if not el:
        out("elastic: no records")
        return
    kill = next((r for r in el if r.get("kind") == "elastic_kill"), None)
    iters = [r for r in el if r.get("kind") == "elastic_iter"]
    resets = [r for r in el if r.get("kind") == "elastic_reset"]
    done = next((r for r in el if r.get("kind") == "elastic_done"), None)
    if kill is None:
        out("elastic: no worker was killed (%d iterations recorded)" % len(iters))
    before = [r for r in iters if kill is None or r["time"] < kill["time"]]
    after = [r for r in iters if kill is not None and r["time"] >= kill["time"]]

    def desc(rs):
        if not rs:
            return "none"
        worlds = sorted({r["world"] for r in rs})
        return "%d iters at world %s, %.1f img/s total (mean), batches %d..%d" % (
            len(rs), "/".join(map(str, worlds)), statistics.mean(r["img_sec_total"] for r in rs),
            rs[0]["batches"], rs[-1]["batches"])

    out("elastic: before the kill: %s" % desc(before))
    out("elastic: after the kill:  %s" % desc(after))
    if kill is not None:
        out("elastic: killed worker 1 (pid %s, %s) with kill -9" %
            (kill.get("pid"), "rank 0" if kill.get("rank0") else "not rank 0"))
        first_reset = next((r for r in resets if r["time"] >= kill["time"]), None)
        if first_reset:
            out("elastic: reset to world %d %.2f s after the kill (resuming at iter %d, %d batches committed)" %
                (first_reset["world"], first_reset["time"] - kill["time"], first_reset["iter"],
                 first_reset["batches"]))
        if after:
            out("elastic: first iteration after the kill ended %.2f s after it" % (after[0]["time"] - kill["time"]))
    if done:
        out("elastic: done: %d iters, %d batches, final world %d, %.1f s" %
            (done["iters"], done["batches"], done["final_world"], done["seconds"]))
    else:
        out("elastic: the job did not finish (no elastic_done record)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--gobench", default="")
    args = ap.parse_args()
    recs = load(args.jsonl)

    def out(s):
        print(s, flush=True)

    for part in (lambda: allreduce_lines(recs, out), lambda: gobench_lines(args.gobench, out) if args.gobench else None,
                 lambda: synthetic_lines(recs, out), lambda: elastic_lines(recs, out)):
        try:
            part()
        except Exception as e:  # one part's surprise must not hide the others
            out("summarize.py: %r" % e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
