#!/usr/bin/env bash
# CI's check of the GPU check on a machine without a GPU: builds with
# GPUCHECK_CPU=1 (the library and launcher as the tests build them, so Go's
# build cache has them) into a temporary folder, runs run.sh's Python steps on
# CPU tensors with a small model (GPUCHECK_CPU=1), and fails unless each
# of them worked: the gorovod.torch and Gloo allreduce benchmarks measured, the
# synthetic benchmark printed img/s at --np 1 and 2, and the elastic run went
# on with the survivor after run.sh killed a worker with kill -9 and finished;
# and the DDP examples on the "gorovod" backend ended with the same
# parameters on both ranks, and compare.py measured DDP on "gorovod" against
# Gloo.
# About 2.5 minutes on 2 cores with a warm build cache. Needs /usr/bin/python3 with torch and
# torchvision (.ci/install); skips, saying so, without them.
#
# Usage: bash bench/gpu/cpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

py=${PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch, torchvision' 2>/dev/null; then
  echo "cpu-check.sh: skipped: $py lacks torch or torchvision (.ci/install installs them)"
  exit 0
fi
tmp=$(mktemp -d /tmp/gorovod-gpucheck-ci.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# summarize.py on Go benchmark lines as the GPU run prints them (what CPU mode
# cannot produce): the allreduce's bus bandwidth against the copy's.
printf '%s\n' 'goos: linux' \
  'BenchmarkAllreduceDevice/bfloat16/64MiB-16   	      40	  26843545 ns/op	2500.00 MB/s	      96 B/op	       2 allocs/op' \
  'BenchmarkCopyDevice/64MiB-16                 	    5000	     33554 ns/op	2000000.00 MB/s' >"$tmp/gobench.txt"
: >"$tmp/empty.jsonl"
got=$("$py" bench/gpu/summarize.py --jsonl "$tmp/empty.jsonl" --gobench "$tmp/gobench.txt")
if ! echo "$got" | grep -q 'BenchmarkAllreduceDevice bfloat16 64 MiB .* busbw *2.500 GB/s = 0.0013 of BenchmarkCopyDevice.s 2000.0 GB/s'; then
  echo "cpu-check.sh: FAIL: summarize.py read the Go benchmark lines as:"; echo "$got"; exit 1
fi

GPUCHECK_CPU=1 GPUCHECK_OUTDIR="$tmp/out" bash bench/gpu/build.sh >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; echo "cpu-check.sh: build.sh failed" >&2; exit 1; }
GPUCHECK_CPU=1 GPUCHECK_OUTDIR="$tmp/out" OUT="$tmp/result" PYTHON="$py" bash bench/gpu/run.sh

summary=$tmp/result/summary.txt
fail=0
want() { # want PATTERN WHAT: summary.txt must have a line matching PATTERN
  if ! grep -Eq "$1" "$summary"; then
    echo "cpu-check.sh: FAIL: $2 (no line matching '$1' in summary.txt)" >&2
    fail=1
  fi
}
want '^allreduce: rc=0 [1-9][0-9]* measurements' "gorovod.torch allreduce benchmark"
want '^torch: rc=0 [1-9][0-9]* measurements' "Gloo baseline"
want '^synth1: rc=0 [0-9.]+ img/s on 1$' "synthetic benchmark at --np 1"
want '^synth2: rc=0 [0-9.]+ img/s on 2$' "synthetic benchmark at --np 2"
want '^elastic: ok rc=0 killed=[0-9]+ \(rank 0: (true|false)\) iters after the kill at world 1: [1-9]' "elastic run with a worker killed"
want '^elastic: done: [0-9]+ iters, [0-9]+ batches, final world 1' "summarize.py's elastic figures"
want '^synthetic scaling: ' "summarize.py's synthetic figures"
want '^ddp: torch [^;]*; ddp_train: ok rc=0; ddp_elastic: ok rc=0$' "DDP examples on the gorovod backend"
want '^ddpbench: rc=0 reps=1; DDP-gorovod vs DDP-Gloo steps/s: [0-9.]+ \([0-9.-]+\) vs [0-9.]+ \([0-9.-]+\): [0-9.]+ \([0-9.-]+\); alone vs DDP-Gloo: [0-9.]+ ' "DDP on gorovod against Gloo (compare.py)"
if [ "$fail" -ne 0 ]; then
  echo "---- summary.txt"; cat "$summary"
  for f in bench.log train.log; do echo "---- $f"; cat "$tmp/result/$f" 2>/dev/null || true; done
  exit 1
fi
echo "cpu-check.sh: ok"
