#!/usr/bin/python3
"""Turn allreduce JSON lines (run.sh, gloo_allreduce.py, mpi_allreduce,
`gorovod bench --json`) into markdown tables: one row per message size, one
column per impl x np; a bus-bandwidth table (GB/s) and a time table (us).

  /usr/bin/python3 table.py results.jsonl [more.jsonl ...]   (or JSON on stdin)
  --metric busbw|time|algbw|all   (default: busbw and time)

Lines that are not JSON objects are ignored; a record without "impl" counts as
gorovod; for a repeated (impl, np, bytes) the last record wins. A result whose
"correct" is false is marked with "!".
Standard library only.
"""
import argparse
import json
import sys

ORDER = ["gorovod", "gloo", "mpi-tcp", "mpi-shm"]
METRICS = {
    "busbw": ("busbw_gbps", "bus bandwidth (GB/s, higher is better)", "%.4g"),
    "algbw": ("algbw_gbps", "algorithm bandwidth (GB/s, higher is better)", "%.4g"),
    "time": ("time_us", "time per allreduce (us, median of per-iteration max over ranks; lower is better)", "%.1f"),
}


def human(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d%s" % (b >> shift, unit)
    return str(b)


def load(streams):
    recs = {}
    for f in streams:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("op", "allreduce") != "allreduce" or "bytes" not in r:
                continue
            recs[(r.get("impl", "gorovod"), int(r.get("np", 0)), int(r["bytes"]))] = r
    return recs


def columns(recs):
    def key(c):
        impl, np = c
        rank = ORDER.index(impl) if impl in ORDER else len(ORDER)
        return (np, rank, impl)

    return sorted({(i, n) for (i, n, _) in recs}, key=key)


def table(recs, metric):
    field, title, fmt = METRICS[metric]
    cols = columns(recs)
    sizes = sorted({b for (_, _, b) in recs})
    out = ["### allreduce float32 sum: " + title, ""]
    out.append("| size | " + " | ".join("%s np%d" % c for c in cols) + " |")
    out.append("|---:|" + "---:|" * len(cols))
    for b in sizes:
        cells = []
        for impl, np in cols:
            r = recs.get((impl, np, b))
            if r is None or r.get(field) is None:
                cells.append("—")
                continue
            cell = fmt % float(r[field])
            if r.get("correct") is False:
                cell += " !"
            cells.append(cell)
        out.append("| %s | %s |" % (human(b), " | ".join(cells)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="JSON-lines files (default: stdin)")
    ap.add_argument("--metric", default="busbw,time", help="busbw, time, algbw, comma list, or all")
    args = ap.parse_args()
    streams = [open(p) for p in args.files] if args.files else [sys.stdin]
    recs = load(streams)
    if not recs:
        print("table.py: no allreduce records", file=sys.stderr)
        return 1
    metrics = list(METRICS) if args.metric == "all" else [m.strip() for m in args.metric.split(",") if m.strip()]
    for m in metrics:
        if m not in METRICS:
            ap.error("unknown metric %r" % m)
    print("\n\n".join(table(recs, m) for m in metrics))
    if any(r.get("correct") is False for r in recs.values()):
        print("\n! = result failed verification")
    return 0


if __name__ == "__main__":
    sys.exit(main())
