#!/usr/bin/env bash
# Compares the gradient noise measurement's cost per step (BenchmarkGradient-
# NoiseOverhead in ./sync) between two commits, interleaved: for each round
# and each case, the old binary then the new one. Prints one line per run:
#   <which> <case> <ns/op>
# then the median (min-max) per which × case.
#
# Usage: bench/gnsoverhead/compare.sh [OLD_COMMIT [NEW_COMMIT [ROUNDS [BENCHTIME]]]]
# Defaults: c4d7047 (before the fused kernel), HEAD, 5 rounds, 2000x.
set -euo pipefail
old=${1:-c4d7047} new=${2:-HEAD} rounds=${3:-5} benchtime=${4:-2000x}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/gnsoverhead.XXXXXX)
trap 'rm -rf "$work"' EXIT
for which in old new; do
  rev=${!which}
  mkdir -p "$work/$which"
  git -C "$root" archive "$rev" | tar -x -C "$work/$which"
  (cd "$work/$which" && go test -c -o "$work/$which.test" ./sync/)
done
cases=${CASES:-'GradientNoiseOverhead/p=1/floats=100000 GradientNoiseOverhead/p=1/floats=1048576 GradientNoiseOverhead/p=2/floats=100000'}
for ((r = 0; r < rounds; r++)); do
  for c in $cases; do
    for which in old new; do
      (cd "$work" && "./$which.test" -test.run '^$' -test.bench "$c" -test.benchtime "$benchtime") |
        awk -v w="$which" '/^Benchmark/ {sub(/-[0-9]+$/, "", $1); print w, $1, $3}'
    done
  done
done | tee "$work/runs"
echo "--- median (min-max) ns/op"
sort -k1,2 -k3n "$work/runs" | awk '
  { k = $1 " " $2; v[k, ++n[k]] = $3 }
  END { for (k in n) { m = n[k]; med = (m % 2) ? v[k, (m + 1) / 2] : (v[k, m / 2] + v[k, m / 2 + 1]) / 2
        printf "%s %.0f (%.0f-%.0f)\n", k, med, v[k, 1], v[k, m] } }' | sort
