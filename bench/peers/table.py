#!/usr/bin/python3
"""Turn allreduce JSON lines (run.sh, gloo_allreduce.py, mpi_allreduce,
`gorovod bench --json`) into markdown tables: one row per message size, one
column per impl x np, one set of tables per condition: the load, and the
pattern when run.sh ran more than one (--patterns: "batched", small
collectives back to back in a sample; "single", one allreduce after a
barrier per sample).

  /usr/bin/python3 table.py results.jsonl [more.jsonl ...]   (or JSON on stdin)
  --metric busbw|time|algbw|all   (default: busbw and time)
  --no-ratios                     leave out the gorovod/peer ratio table

A cell is the median over the runs of that (load, impl, np, size) and, when
there are several, their spread "(min–max)"; each run's own figure is already
the median of its samples. The ratio table pairs runs of the same rep (run.sh
runs them back to back): gorovod-X / mpi-X busbw for X = tcp, shm, and
gorovod-X / LABEL-X for binaries given to run.sh --compare; its cells are the
median and spread of the per-rep ratios (> 1: gorovod faster).

Lines that are not JSON objects are ignored; a record without "impl" counts as
gorovod, without "load" as "-", without "pattern" as batched. {"meta": ...} lines (run.sh writes one) are
printed first. A result whose "correct" is false is marked with "!".
Standard library only.
"""
import argparse
import json
import statistics
import sys
from collections import defaultdict

METRICS = {
    "busbw": ("busbw_gbps", "bus bandwidth (GB/s, higher is better)", "%.3g"),
    "algbw": ("algbw_gbps", "algorithm bandwidth (GB/s, higher is better)", "%.3g"),
    "time": ("time_us", "time per allreduce (µs, lower is better)", "%.1f"),
}


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)


PATTERNS = {"batched": "batched", "single": "one allreduce after a barrier"}


def condition(r):
    """A record's condition: its load, and its pattern unless batched."""
    ld, pattern = str(r.get("load", "-")), r.get("pattern", "batched")
    return ld if pattern == "batched" else "%s, %s" % (ld, PATTERNS.get(pattern, pattern))


def load(streams):
    """Returns (metas, runs): runs[(condition, impl, np, bytes)] = [record, ...]."""
    metas, runs = [], defaultdict(list)
    for f in streams:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if "meta" in r:
                metas.append(r["meta"])
                continue
            if r.get("op", "allreduce") != "allreduce" or "bytes" not in r:
                continue
            key = (condition(r), r.get("impl", "gorovod"), int(r.get("np", 0)), int(r["bytes"]))
            runs[key].append(r)
    return metas, runs


def impl_rank(impl):
    """Columns go by transport: gorovod's, then --compare builds, then the peer."""
    for t, tr in enumerate(("tcp", "shm")):
        if impl.endswith("-" + tr):
            who = 0 if impl == "gorovod-" + tr else 2 if impl == "mpi-" + tr else 1
            return (t, who, impl)
    return (2, 0 if impl == "gorovod" else 1, impl)


def columns(runs, ld):
    cols = {(i, n) for (l, i, n, _) in runs if l == ld}
    return sorted(cols, key=lambda c: (c[1], impl_rank(c[0])))


def cell(values, fmt):
    if not values:
        return "—"
    med = fmt % statistics.median(values)
    if len(values) == 1:
        return med
    return "%s (%s–%s)" % (med, fmt % min(values), fmt % max(values))


def table(runs, ld, metric):
    field, title, fmt = METRICS[metric]
    cols = columns(runs, ld)
    sizes = sorted({b for (l, _, _, b) in runs if l == ld})
    nruns = sorted({len(v) for (l, *_), v in runs.items() if l == ld})
    what = "median of %s runs (min–max)" % "/".join(map(str, nruns)) if nruns != [1] else "one run"
    out = ["### %s: allreduce float32 sum, %s; %s" % (ld, title, what), ""]
    out.append("| size | " + " | ".join("%s np%d" % c for c in cols) + " |")
    out.append("|---:|" + "---:|" * len(cols))
    for b in sizes:
        cells = []
        for impl, np in cols:
            recs = runs.get((ld, impl, np, b), [])
            c = cell([float(r[field]) for r in recs if r.get(field) is not None], fmt)
            if any(r.get("correct") is False for r in recs):
                c += " !"
            cells.append(c)
        out.append("| %s | %s |" % (human(b), " | ".join(cells)))
    return "\n".join(out)


def pairs(runs, ld):
    """(numerator impl, denominator impl) pairs present under load ld."""
    impls = {i for (l, i, _, _) in runs if l == ld}
    out = []
    for tr in ("tcp", "shm"):
        mine = "gorovod-" + tr
        for i in sorted(impls, key=impl_rank):
            if i.endswith("-" + tr) and not i.startswith("mpi-") and "mpi-" + tr in impls:
                out.append((i, "mpi-" + tr))
        # A/B: gorovod's build against each --compare build.
        for i in sorted(impls, key=impl_rank):
            if i.endswith("-" + tr) and i != mine and not i.startswith("mpi-") and mine in impls:
                out.append((mine, i))
    if "gorovod" in impls and "mpi-tcp" in impls:
        out.append(("gorovod", "mpi-tcp"))
    return out


def ratio_table(runs, ld):
    prs = pairs(runs, ld)
    if not prs:
        return None
    nps = sorted({n for (l, _, n, _) in runs if l == ld})
    sizes = sorted({b for (l, _, _, b) in runs if l == ld})
    cols = [(a, z, n) for n in nps for (a, z) in prs]
    out = ["### %s: busbw ratio, paired by rep: median (min–max); > 1 means the first is faster" % ld, ""]
    out.append("| size | " + " | ".join("%s / %s np%d" % c for c in cols) + " |")
    out.append("|---:|" + "---:|" * len(cols))
    for b in sizes:
        cells = []
        for a, z, n in cols:
            by_rep = {}
            for r in runs.get((ld, z, n, b), []):
                by_rep[r.get("rep")] = float(r["busbw_gbps"])
            ratios = []
            for r in runs.get((ld, a, n, b), []):
                d = by_rep.get(r.get("rep"))
                if d:
                    ratios.append(float(r["busbw_gbps"]) / d)
            cells.append(cell(ratios, "%.2f"))
        out.append("| %s | %s |" % (human(b), " | ".join(cells)))
    return "\n".join(out)


def describe(meta):
    keys = ["date", "host", "cpu", "cpus", "mem_gib", "kernel", "git", "loadavg_at_start", "command"]
    return "- " + ", ".join("%s: %s" % (k, meta[k]) for k in keys if k in meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="JSON-lines files (default: stdin)")
    ap.add_argument("--metric", default="busbw,time", help="busbw, time, algbw, comma list, or all")
    ap.add_argument("--no-ratios", action="store_true", help="leave out the ratio tables")
    args = ap.parse_args()
    streams = [open(p) for p in args.files] if args.files else [sys.stdin]
    metas, runs = load(streams)
    if not runs:
        print("table.py: no allreduce records", file=sys.stderr)
        return 1
    metrics = list(METRICS) if args.metric == "all" else [m.strip() for m in args.metric.split(",") if m.strip()]
    for m in metrics:
        if m not in METRICS:
            ap.error("unknown metric %r" % m)
    parts = []
    if metas:
        parts.append("\n".join(describe(m) for m in metas))
    for ld in sorted({l for (l, *_) in runs}, key=lambda l: (not l.startswith("idle"), l)):
        parts.extend(table(runs, ld, m) for m in metrics)
        if not args.no_ratios:
            t = ratio_table(runs, ld)
            if t:
                parts.append(t)
    print("\n\n".join(parts))
    if any(r.get("correct") is False for v in runs.values() for r in v):
        print("\n! = result failed verification")
    return 0


if __name__ == "__main__":
    sys.exit(main())
