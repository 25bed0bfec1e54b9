#!/usr/bin/env bash
# The GPU check of gorovod.torch's CUDA tensors (gpu_cuda_tensors.py), in two
# halves for a GPU machine that has PyTorch but no Go:
#
#   bash bindings/python/tests/gpu_cuda_tensors.sh build    # here, with Go
#   bash bindings/python/tests/gpu_cuda_tensors.sh run [NP] # there, from the repository root
#
# build writes bindings/python/tests/gpu-out/ (ignored by git): libgorovod.so
# as users build it (it loads the NVIDIA driver at run time), and the gorovod
# launcher, xz-compressed (63 MB stripped, about 14 MB
# compressed: a tree carried to a device machine may hold 64 MiB in all).
# run unpacks the launcher into /tmp and runs NP (default 2) workers of
# gpu_cuda_tensors.py under `gorovod run`; every worker may share one GPU.
# Its exit status is the check's: 0 when every check passed on every rank.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bindings/python/tests/gpu-out

case "${1:-}" in
build)
  rm -rf "$out"
  mkdir -p "$out"
  export GOOS=linux GOARCH=amd64 CGO_ENABLED=1
  go build -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$out/libgorovod.so" ./bindings/c
  rm -f "$out/libgorovod.h" # cgo's header; gorovod.h is the interface
  go build -trimpath -ldflags='-s -w' -o "$out/gorovod" ./cmd/gorovod
  xz -6 -f "$out/gorovod"
  git rev-parse HEAD >"$out/COMMIT"
  ls -l "$out"
  ;;
run)
  np=${2:-2}
  bin=$(mktemp -d)/gorovod
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$out/gorovod.xz" "$bin"
  chmod +x "$bin"
  echo "commit $(cat "$out/COMMIT" 2>/dev/null || echo unknown); $(nvidia-smi -L 2>&1 | head -1)"
  GOROVOD_LIBRARY="$PWD/$out/libgorovod.so" PYTHONPATH="$PWD/bindings/python" PYTHONUNBUFFERED=1 \
    "$bin" run --np "$np" -- python3 bindings/python/tests/gpu_cuda_tensors.py
  ;;
*)
  echo "usage: $0 build | run [NP]" >&2
  exit 2
  ;;
esac
