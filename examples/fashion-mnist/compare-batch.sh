#!/usr/bin/env bash
# The fixed-versus-adaptive batch comparison of docs/goodput.md: Fashion-MNIST
# under `gorovod run` at each world size in $WORKERS, with fixed global
# batches 64, 256 and 1024 and the adaptive batch starting at 64 (at most
# 1024), all with the same learning-rate rule ($RULE) against M0 = 64. Writes
# one JSON-lines file per run into $OUT, prints the time-to-accuracy table and
# draws $OUT/goodput.png.
#
#   OUT=/tmp/compare WORKERS="1 2" EPOCHS=6 SEED=1 examples/fashion-mnist/compare-batch.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gorovod-goodput-compare}
WORKERS=${WORKERS:-1 2}
EPOCHS=${EPOCHS:-6}
RULE=${RULE:-adascale}
EVAL=${EVAL:-5000}
SEED=${SEED:-1}
mkdir -p "$OUT"
go build -o "$OUT/gorovod" ./cmd/gorovod
go build -o "$OUT/fashion-mnist" ./examples/fashion-mnist
go build -o "$OUT/goodputplot" ./examples/fashion-mnist/goodputplot
common=(--seed "$SEED" --epochs "$EPOCHS" --json --log-every 0 --eval-every-samples "$EVAL" --lr-rule "$RULE")
files=()
for w in $WORKERS; do
	for mode in fixed-64 fixed-256 fixed-1024 adaptive; do
		case $mode in
		fixed-*) args=(--batch-size "${mode#fixed-}" --lr-batch-size 64) ;;
		adaptive) args=(--batch-size 64 --adaptive --max-batch-size 1024 --refit-every 5s) ;;
		esac
		f="$OUT/${w}w-$mode.jsonl"
		echo "== $w workers, $mode" >&2
		"$OUT/gorovod" run --np "$w" --min-np "$w" --max-np "$w" -- "$OUT/fashion-mnist" "${common[@]}" "${args[@]}" >"$f" 2>"$OUT/${w}w-$mode.log"
		files+=("$f")
	done
done
"$OUT/goodputplot" -o "$OUT/goodput.png" -target 0.85 "${files[@]}"
