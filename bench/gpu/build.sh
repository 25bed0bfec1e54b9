#!/usr/bin/env bash
# Builds, on a machine with Go (not the GPU machine), what bench/gpu/run.sh runs
# on the lent GPU machine, into bench/gpu/out/ (ignored by git; the device tool
# carries it with carry: ["bench/gpu/out"]); run.sh needs nothing else:
#
#   cuda.test                  go test -tags cuda -c ./collective/cuda (the GPU tests)
#   gorovod.gz                 the launcher, go build ./cmd/gorovod, gzipped (the
#                              Kubernetes client makes it ~60 MiB, ~20 gzipped;
#                              run.sh unpacks it on the GPU machine)
#   python/gorovod/            a copy of bindings/python/gorovod with
#                              libgorovod.so beside it (go build
#                              -buildmode=c-shared ./bindings/c, the build users
#                              make), where the package looks for it
#   scripts/                   bench/gpu's Python scripts, and the DDP examples
#                              (examples/pytorch/ddp_train.py, ddp_elastic.py)
#   MANIFEST.txt               what was built, from which commit, dependencies
#
# All linux/amd64 with -trimpath -ldflags='-s -w'. Every binary links glibc
# only (the CUDA code loads the driver's libcuda.so.1 at run time); this
# prints each one's shared libraries and fails on any other, and prints the
# size to carry against the device tool's 64 MiB limit (tree plus carried
# paths).
#
# Usage: bash bench/gpu/build.sh   (from anywhere in the clone)
#
# GPUCHECK_OUTDIR=DIR builds into DIR instead. GPUCHECK_CPU=1 builds for
# run.sh's CPU mode (GPUCHECK_CPU=1 bash bench/gpu/run.sh, what CI runs): no
# cuda.test, and the library and launcher as the tests build them (no
# -trimpath: Go's build cache has them), gzip -1, no size limit.
set -euo pipefail
cd "$(dirname "$0")/../.."

cpu=${GPUCHECK_CPU:-0}

out=${GPUCHECK_OUTDIR:-bench/gpu/out}
rm -rf "$out"
mkdir -p "$out"

export GOOS=linux GOARCH=amd64 CGO_ENABLED=1
# -s -w drops the symbol table and DWARF (Go's own stack traces still work).
flags=(-trimpath -ldflags='-s -w')
gz=-9
if [ "$cpu" = 1 ]; then
  flags=() gz=-1
else
  echo "--- go test -tags cuda -c ./collective/cuda -> $out/cuda.test"
  go test -tags cuda -c "${flags[@]}" -o "$out/cuda.test" ./collective/cuda
fi

echo "--- the Python package, with go build -buildmode=c-shared ./bindings/c -> $out/python/gorovod/libgorovod.so"
mkdir -p "$out/python"
cp -r bindings/python/gorovod "$out/python/gorovod"
find "$out/python" -name __pycache__ -type d -prune -exec rm -rf {} +
go build "${flags[@]}" -buildmode=c-shared -o "$out/python/gorovod/libgorovod.so" ./bindings/c
rm -f "$out/python/gorovod/libgorovod.h" # cgo's; gorovod.h is the interface

echo "--- go build ./cmd/gorovod -> $out/gorovod.gz"
go build "${flags[@]}" -o "$out/gorovod" ./cmd/gorovod

echo "--- the scripts -> $out/scripts"
mkdir -p "$out/scripts"
cp bench/gpu/*.py "$out/scripts/"
# The DDP examples as users run them (run.sh's ddp step).
cp examples/pytorch/ddp_train.py examples/pytorch/ddp_elastic.py "$out/scripts/"
# DDP on "gorovod" against Gloo on CPU (run.sh's ddpbench step).
cp bindings/python/bench/compare.py bindings/python/bench/train_bench.py "$out/scripts/"

# Benchmarks in the binary (none today): listed so run.sh knows whether to run -test.bench.
benches=$(grep -h '^func Benchmark' collective/cuda/*_test.go 2>/dev/null | sed 's/^func \(Benchmark[A-Za-z0-9_]*\).*/\1/' || true)

# needs FILE: prints FILE's shared libraries and newest glibc symbol version;
# fails when it needs a library beyond glibc.
needs() {
  local f=$1 lib bad=0
  local needed glibc_max
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  glibc_max=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  echo "--- $f: NEEDED $(echo $needed); newest glibc symbol version $glibc_max"
  for lib in $needed; do
    case "$lib" in
    libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | ld-linux-x86-64.so.2) ;; # glibc
    *) echo "build.sh: $f needs $lib, which a machine with only glibc and the driver may lack" >&2; bad=1 ;;
    esac
  done
  echo "$f: $(echo $needed) ($glibc_max)" >>"$out/.deps"
  return $bad
}
: >"$out/.deps"
[ "$cpu" = 1 ] || needs "$out/cuda.test"
needs "$out/python/gorovod/libgorovod.so"
needs "$out/gorovod"

# The launcher is ~60 MiB (the Kubernetes client); gzipped it fits the carry limit.
gzip "$gz" -f "$out/gorovod"

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!bench/gpu' || echo ' (work tree differs)')"
  echo "go: $(go version)"
  echo "mode: $([ "$cpu" = 1 ] && echo "GPUCHECK_CPU=1 (for run.sh's CPU mode)" || echo "the GPU check")"
  echo "cuda.test: go test -tags cuda -c ./collective/cuda"
  echo "python/gorovod: bindings/python/gorovod; libgorovod.so: go build -buildmode=c-shared ./bindings/c"
  echo "gorovod.gz: go build ./cmd/gorovod, gzip -9"
  echo "scripts: $(cd "$out/scripts" && echo *.py)"
  echo "shared libraries (newest glibc symbol version):"
  sed 's/^/  /' "$out/.deps"
  echo "benchmarks in cuda.test: $(echo ${benches:-none})"
} >"$out/MANIFEST.txt"
rm -f "$out/.deps"

echo "--- sizes (device tool: tree + carried paths <= 64 MiB)"
find "$out" -type f -size +64k -printf '  %s\t%p\n' | sort -rn
carry=$(du -sb "$out" | cut -f1)
# What the device tool copies: tracked files and untracked files git does not ignore.
tree=$( (git ls-files -z; git ls-files -z -o --exclude-standard) |
  xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((carry + tree))
limit=$((64 * 1024 * 1024))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "  carried $out: $carry bytes ($(mib "$carry"))"
echo "  tree (tracked + untracked, not ignored): $tree bytes ($(mib "$tree"))"
echo "  total: $total bytes ($(mib "$total")) of $limit (64 MiB)"

if [ "$cpu" != 1 ] && [ "$total" -gt "$limit" ]; then
  echo "build.sh: tree plus $out is over the device tool's 64 MiB carry limit" >&2
  exit 1
fi
echo "build.sh: ok"
