#!/usr/bin/env bash
# Builds, on a machine with Go (not the GPU machine), what bench/gpu/run.sh runs
# on the lent GPU machine, into bench/gpu/out/ (ignored by git; the device tool
# carries it with carry: ["bench/gpu/out"]):
#
#   cuda.test    go test -tags cuda -c ./collective/cuda, linux/amd64
#   MANIFEST.txt what was built, from which commit, its dynamic dependencies
#
# The package has no benchmarks (nothing with the cuda tag has a Benchmark
# function); should one appear in collective/cuda, cuda.test contains it and
# run.sh runs it (-test.bench with a bounded -test.benchtime).
#
# The binary links libcuda.so.1 dynamically (the stub in the CUDA cache at
# build time; the NVIDIA driver's copy on the GPU machine). It prints every
# shared library the binary needs and fails if any is not one a machine with
# only glibc and the NVIDIA driver has. It also prints the size to carry
# against the device tool's 64 MiB limit (tree plus carried paths).
#
# Usage: bash bench/gpu/build.sh   (from anywhere in the clone)
set -euo pipefail
cd "$(dirname "$0")/../.."

cuda_root=${GOROVOD_CUDA_ROOT:-/var/cache/gorovod/cuda-11.8} # filled by .ci/install
if [ ! -f "$cuda_root/include/cuda.h" ] || [ ! -e "$cuda_root/lib/libcuda.so" ]; then
  echo "build.sh: $cuda_root lacks include/cuda.h or lib/libcuda.so; running .ci/install" >&2
  bash .ci/install
fi

out=bench/gpu/out
rm -rf "$out"
mkdir -p "$out"

export GOOS=linux GOARCH=amd64 CGO_ENABLED=1
export CGO_CFLAGS="-I$cuda_root/include" CGO_LDFLAGS="-L$cuda_root/lib"

echo "--- go test -tags cuda -c ./collective/cuda -> $out/cuda.test"
# -s -w drops the symbol table and DWARF (Go's own stack traces still work).
go test -tags cuda -c -trimpath -ldflags='-s -w' -o "$out/cuda.test" ./collective/cuda

# Benchmarks in the binary (none today): listed so run.sh knows whether to run -test.bench.
benches=$(grep -h '^func Benchmark' collective/cuda/*_test.go 2>/dev/null | sed 's/^func \(Benchmark[A-Za-z0-9_]*\).*/\1/' || true)

echo "--- dynamic dependencies of $out/cuda.test"
needed=$(readelf -d "$out/cuda.test" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$needed" | sed 's/^/NEEDED /'
interp=$(readelf -p .interp "$out/cuda.test" 2>/dev/null | sed -n 's/.*\]  *//p' | head -1)
echo "interpreter: $interp"
glibc_max=$(objdump -T "$out/cuda.test" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
echo "newest glibc symbol version needed: $glibc_max"
echo "ldd (here, against the stub libcuda):"
LD_LIBRARY_PATH="$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$out/cuda.test" || true

bad=0
for lib in $needed; do
  case "$lib" in
  libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | ld-linux-x86-64.so.2) ;; # glibc
  libcuda.so.1) ;; # the NVIDIA driver
  *) echo "build.sh: $out/cuda.test needs $lib, which a machine with only the driver may lack" >&2; bad=1 ;;
  esac
done
[ "$bad" -eq 0 ] || exit 1

{
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!bench/gpu' || echo ' (work tree differs)')"
  echo "go: $(go version)"
  echo "cuda headers/stub: $cuda_root"
  echo "binary: cuda.test (go test -tags cuda -c ./collective/cuda)"
  echo "needed: $(echo $needed)"
  echo "glibc: $glibc_max"
  echo "benchmarks: ${benches:-none}"
} >"$out/MANIFEST.txt"

echo "--- sizes (device tool: tree + carried paths <= 64 MiB)"
du -b "$out"/* | sed 's/^/  /'
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

if [ "$total" -gt "$limit" ]; then
  echo "build.sh: tree plus $out is over the device tool's 64 MiB carry limit" >&2
  exit 1
fi
echo "build.sh: ok"
