#!/usr/bin/env bash
# The GPU check, run ON the lent GPU machine (no Go there) from the repository
# root, over what bench/gpu/build.sh built here into bench/gpu/out/:
#
#   bash bench/gpu/run.sh        (device tool: carry ["bench/gpu/out"], timeout_s ~480)
#
# Steps, each with its own timeout; a failing step is recorded and the next
# one runs, and the script always exits 0 (the summary says what happened):
#   1. env:    nvidia-smi -L / nvidia-smi / driver and CUDA versions, glibc,
#              how libcuda.so.1 resolves for the test binary  -> $OUT/env.txt
#   2. tests:  bench/gpu/out/cuda.test -test.v -test.count=1 (timeout 240)
#                                                           -> $OUT/cuda-tests.txt
#   3. bench:  the binary's Benchmark functions, if any, -test.benchtime bounded
#                                                           -> $OUT/cuda-bench.txt
#   4. torch:  bench/gpu/torch_baseline.py (Gloo allreduce of CUDA tensors, 2
#              processes on the GPU; device-to-device copy bandwidth)
#                                     -> $OUT/torch-baseline.jsonl, .log
#   summary -> $OUT/summary.txt and the last line of the output.
# The whole run stays under about 7 minutes (DEADLINE_S, default 420).
# Without a GPU every step says "no GPU" and the script ends in a second or two.
set -u
cd "$(dirname "$0")/../.." || exit 0
root=$(pwd)

if [ -z "${OUT:-}" ]; then
  OUT=$(mktemp -d /tmp/gorovod-gpucheck.XXXXXX)
  echo "run.sh: OUT is not set; writing to $OUT"
fi
mkdir -p "$OUT"
bin="$root/bench/gpu/out/cuda.test"
deadline=${DEADLINE_S:-420}
py=${PYTHON:-python3}
SECONDS=0
summary=()

note() { summary+=("$1"); echo "run.sh: $1"; }
left() { echo $((deadline - SECONDS)); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

# ---- GPU present?
gpu=no
gpu_list=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_list=$(timeout 20 nvidia-smi -L 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ] && echo "$gpu_list" | grep -q '^GPU [0-9]'; then gpu=yes; fi
  echo "nvidia-smi -L (rc $rc):"
  echo "$gpu_list"
else
  echo "run.sh: no nvidia-smi on PATH"
fi

# ---- 1. env
{
  echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "== uname: $(uname -a)"
  echo "== nproc: $(nproc 2>/dev/null)"
  echo "== glibc: $(ldd --version 2>&1 | head -1)"
  echo "== GPU: $gpu"
  echo "== nvidia-smi -L:"
  echo "${gpu_list:-(no nvidia-smi)}"
  if [ "$gpu" = yes ]; then
    echo "== nvidia-smi:"
    timeout 20 nvidia-smi 2>&1
    echo "== nvidia-smi --query-gpu:"
    timeout 20 nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    echo "== driver's CUDA version: $(timeout 20 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1)"
    echo "== /proc/driver/nvidia/version:"
    cat /proc/driver/nvidia/version 2>&1
  else
    echo "== nvidia-smi: no GPU"
  fi
  echo "== nvcc: $(timeout 10 nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
  echo "== LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  echo "== ldconfig -p | grep libcuda:"
  ldconfig -p 2>/dev/null | grep 'libcuda\.so' || echo "(none in the ldconfig cache)"
  echo "== bench/gpu/out/MANIFEST.txt:"
  cat bench/gpu/out/MANIFEST.txt 2>&1
} >"$OUT/env.txt" 2>&1

# libcuda.so.1 for the test binary: where the loader finds it, or the driver's usual folders.
libcuda=""
if [ -x "$bin" ]; then
  if ldd "$bin" 2>/dev/null | grep -q 'libcuda.so.1 => not found'; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/compat /usr/local/cuda/lib64; do
      if [ -e "$d/libcuda.so.1" ]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        libcuda="$d/libcuda.so.1 (added $d to LD_LIBRARY_PATH)"
        break
      fi
    done
  fi
  {
    echo "== ldd bench/gpu/out/cuda.test${libcuda:+ (after adding $libcuda)}:"
    ldd "$bin" 2>&1
  } >>"$OUT/env.txt" 2>&1
fi
if [ "$gpu" = yes ]; then
  note "env: ok ($(echo "$gpu_list" | head -1 | cut -c1-80))"
else
  note "env: no GPU (env.txt has the host facts)"
fi

# ---- 2. tests
if [ "$gpu" != yes ]; then
  echo "no GPU: the CUDA backend tests were not run" >"$OUT/cuda-tests.txt"
  note "tests: no GPU, skipped"
elif [ ! -x "$bin" ]; then
  echo "no $bin: run bench/gpu/build.sh on the build machine and carry bench/gpu/out" >"$OUT/cuda-tests.txt"
  note "tests: rc=missing-binary"
else
  t=$(min 240 $(($(left) - 60)))
  if [ "$t" -lt 30 ]; then
    echo "not run: too little time left ($(left) s)" >"$OUT/cuda-tests.txt"
    note "tests: skipped, no time left"
  else
    # Like go test: from the package's folder; -test.timeout makes Go print the
    # goroutines of a hung test before timeout(1) has to kill it.
    (cd collective/cuda && timeout -k 10 "$t" "$bin" -test.v -test.count=1 -test.timeout=$((t - 10))s) \
      >"$OUT/cuda-tests.txt" 2>&1
    rc=$?
    pass=$(grep -c -- '^\s*--- PASS' "$OUT/cuda-tests.txt")
    fail=$(grep -c -- '^\s*--- FAIL' "$OUT/cuda-tests.txt")
    skip=$(grep -c -- '^\s*--- SKIP' "$OUT/cuda-tests.txt")
    extra=""
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && extra=" TIMED OUT after ${t}s"
    # No test ran (the binary did not start, say): quote its first line.
    [ $((pass + fail + skip)) -eq 0 ] && extra="$extra; output: $(head -1 "$OUT/cuda-tests.txt" | cut -c1-200)"
    note "tests: rc=$rc pass=$pass fail=$fail skip=$skip (top-level and subtests)$extra"
  fi
fi

# ---- 3. benchmarks in the test binary
if [ "$gpu" != yes ]; then
  echo "no GPU: benchmarks not run" >"$OUT/cuda-bench.txt"
  note "bench: no GPU, skipped"
elif [ ! -x "$bin" ]; then
  echo "no $bin" >"$OUT/cuda-bench.txt"
  note "bench: rc=missing-binary"
else
  benches=$(cd collective/cuda && timeout 30 "$bin" -test.list '^Benchmark' 2>/dev/null | grep '^Benchmark')
  if [ -z "$benches" ]; then
    echo "no Benchmark functions in cuda.test (-test.list '^Benchmark' printed none)" >"$OUT/cuda-bench.txt"
    note "bench: none in the binary"
  else
    t=$(min 100 $(($(left) - 45)))
    if [ "$t" -lt 15 ]; then
      echo "not run: too little time left ($(left) s)" >"$OUT/cuda-bench.txt"
      note "bench: skipped, no time left"
    else
      (cd collective/cuda && timeout -k 10 "$t" "$bin" -test.run '^$' -test.bench . -test.benchtime 0.5s \
        -test.count 1 -test.benchmem -test.timeout=$((t - 5))s) >"$OUT/cuda-bench.txt" 2>&1
      rc=$?
      note "bench: rc=$rc $(grep -c '^Benchmark.*ns/op' "$OUT/cuda-bench.txt") results ($(echo $benches | wc -w) functions)"
    fi
  fi
fi

# ---- 4. PyTorch baseline
if [ "$gpu" != yes ]; then
  echo '{"kind": "skipped", "reason": "no GPU"}' >"$OUT/torch-baseline.jsonl"
  echo "no GPU: torch_baseline.py not run" >"$OUT/torch-baseline.log"
  note "torch: no GPU, skipped"
else
  t=$(min 135 $(($(left) - 45)))
  if [ "$t" -lt 30 ]; then
    echo '{"kind": "skipped", "reason": "no time left"}' >"$OUT/torch-baseline.jsonl"
    note "torch: skipped, no time left"
  else
    PYTHONUNBUFFERED=1 timeout -k 10 "$t" "$py" bench/gpu/torch_baseline.py \
      --out "$OUT/torch-baseline.jsonl" --budget $((t - 15)) >"$OUT/torch-baseline.log" 2>&1
    rc=$?
    n=$(grep -c '"kind": "\(allreduce\|copy\)"' "$OUT/torch-baseline.jsonl" 2>/dev/null)
    note "torch: rc=$rc ${n:-0} measurements"
  fi
fi

# ---- 5. CUDA IPC between two processes (what same-host device exchange needs)
if [ "$gpu" = yes ] && [ "$(left)" -gt 40 ]; then
  PYTHONUNBUFFERED=1 timeout -k 5 35 "$py" bench/gpu/probe_ipc.py >"$OUT/ipc-probe.txt" 2>&1
  note "ipc: rc=$? $(tail -1 "$OUT/ipc-probe.txt" | cut -c1-200)"
fi

printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
line="SUMMARY gpu=$gpu elapsed=${SECONDS}s | $(IFS='|'; echo "${summary[*]}" | sed 's/|/ | /g')"
echo "$line" >>"$OUT/summary.txt"
echo "$line"
exit 0
