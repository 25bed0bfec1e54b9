#!/usr/bin/env bash
# Side-by-side allreduce sweep: PyTorch-Gloo, Open MPI over TCP (loopback) and
# Open MPI over shared memory (vader), optionally gorovod, in one run. Every
# result is one JSON line on stdout, in gorovod's `bench --json` format plus an
# "impl" field; everything else goes to stderr.
#
#   bench/peers/run.sh [--sizes 4K,256K,4M,64M | --min-bytes 4K --max-bytes 64M --factor 4]
#                      [--iters 20] [--warmup 5] [--np "2 4"] [--impls gloo,mpi-tcp,mpi-shm,gorovod]
#                      [--batch-time-us 0] [--gorovod PATH] [--timeout 1800] [--table]
#
#   bench/peers/run.sh --sizes 4K,256K,4M,64M --gorovod ./gorovod | tee peers.jsonl
#   /usr/bin/python3 bench/peers/table.py peers.jsonl
#
# Needs: apt-get install python3-torch openmpi-bin libopenmpi-dev (see README.md).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3          # Debian's python: the one python3-torch installs into

min_bytes=4K max_bytes=64M factor=4 sizes="" iters=20 warmup=5
nps="2 4" impls="gloo,mpi-tcp,mpi-shm,gorovod" batch_us=0
gorovod="" gorovod_args="" timeout_s=1800 table=0

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --min-bytes) min_bytes=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    --factor) factor=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --np) nps=${2//,/ }; shift 2 ;;
    --impls) impls=$2; shift 2 ;;
    --batch-time-us) batch_us=$2; shift 2 ;;
    --gorovod) gorovod=$2; shift 2 ;;
    --gorovod-args) gorovod_args=$2; shift 2 ;;   # extra words appended to the gorovod call
    --timeout) timeout_s=$2; shift 2 ;;
    --table) table=1; shift ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
done

want() { case ",$impls," in *",$1,"*) return 0 ;; esac; return 1; }
log() { echo "run.sh: $*" >&2; }

# The size arguments every program understands.
if [ -n "$sizes" ]; then
  size_args=(--sizes "$sizes")
else
  size_args=(--min-bytes "$min_bytes" --max-bytes "$max_bytes" --factor "$factor")
fi
common=("${size_args[@]}" --warmup "$warmup" --iters "$iters" --batch-time-us "$batch_us")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl
: >"$results"

# JSON lines -> stdout (and the results file for --table); anything else -> stderr.
# $1 names the impl for lines that lack an "impl" field (gorovod's own output).
split() {
  local impl=$1
  while IFS= read -r line; do
    case "$line" in
      "{"*)
        case "$line" in *'"impl"'*) ;; *) line="{\"impl\": \"$impl\", ${line#\{}" ;; esac
        printf '%s\n' "$line"; printf '%s\n' "$line" >>"$results" ;;
      *) printf '%s\n' "$line" >&2 ;;
    esac
  done
}

failed=0
run() {  # run IMPL NP CMD...
  local impl=$1 np=$2; shift 2
  log "$impl np=$np: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$timeout_s" "$@" 2> >(sed "s/^/[$impl np=$np] /" >&2) | split "$impl"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then log "$impl np=$np FAILED (exit $rc)"; failed=1; fi
  log "$impl np=$np took $((SECONDS - t0))s"
}

# --- preflight -------------------------------------------------------------
have_gloo=0 have_mpi=0
if want gloo; then
  if "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then have_gloo=1
  else log "skipping gloo: $PY cannot import torch with Gloo (apt-get install python3-torch)"; fi
fi
if want mpi-tcp || want mpi-shm; then
  if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    if mpicc -O2 -o "$tmp/mpi_allreduce" "$HERE/mpi_allreduce.c"; then have_mpi=1
    else log "skipping MPI: mpicc failed"; failed=1; fi
  else log "skipping MPI: no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)"; fi
fi
have_gorovod=0
if want gorovod && [ -n "$gorovod" ]; then
  if [ -x "$gorovod" ]; then have_gorovod=1; else log "skipping gorovod: $gorovod is not an executable file"; fi
fi

# Open MPI: root needs --allow-run-as-root; np > cores needs --oversubscribe (MPI
# then yields when idle instead of spinning). The TCP BTL leaves out 127.0.0.0/8
# by default and would talk over eth0, so pin it (and the runtime's OOB) to lo.
# Debian's /etc/openmpi/openmpi-mca-params.conf already disables ucx/ofi/openib;
# pml ob1 is named anyway so the transport is exactly the one the label says.
mpirun_base=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca oob_tcp_if_include lo --mca pml ob1)
mpi_tcp=(--mca btl tcp,self --mca btl_tcp_if_include lo)
mpi_shm=(--mca btl vader,self)

# --- sweep -------------------------------------------------------------------
for np in $nps; do
  if [ "$have_gorovod" = 1 ]; then
    # `gorovod bench` takes min/max/factor only (no --sizes), and batches small
    # with --batch-time-us exactly as the peers do (0: one collective per sample).
    if [ -n "$sizes" ]; then
      for s in ${sizes//,/ }; do
        # shellcheck disable=SC2086  # gorovod_args is a word list on purpose
        run gorovod "$np" "$gorovod" bench allreduce --np "$np" --min-bytes "$s" --max-bytes "$s" \
          --warmup "$warmup" --iters "$iters" --batch-time "${batch_us}us" --json $gorovod_args
      done
    else
      # shellcheck disable=SC2086
      run gorovod "$np" "$gorovod" bench allreduce --np "$np" "${size_args[@]}" \
        --warmup "$warmup" --iters "$iters" --batch-time "${batch_us}us" --json $gorovod_args
    fi
  fi
  if [ "$have_gloo" = 1 ] && want gloo; then
    run gloo "$np" env GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-lo}" "$PY" "$HERE/gloo_allreduce.py" --np "$np" "${common[@]}"
  fi
  if [ "$have_mpi" = 1 ] && want mpi-tcp; then
    run mpi-tcp "$np" "${mpirun_base[@]}" "${mpi_tcp[@]}" -np "$np" "$tmp/mpi_allreduce" --impl mpi-tcp "${common[@]}"
  fi
  if [ "$have_mpi" = 1 ] && want mpi-shm; then
    run mpi-shm "$np" "${mpirun_base[@]}" "${mpi_shm[@]}" -np "$np" "$tmp/mpi_allreduce" --impl mpi-shm "${common[@]}"
  fi
done

if [ "$table" = 1 ]; then
  echo >&2
  "$PY" "$HERE/table.py" "$results" >&2
fi
exit "$failed"
