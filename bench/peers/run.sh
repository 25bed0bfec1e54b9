#!/usr/bin/env bash
# The measurement protocol: gorovod next to Open MPI (TCP over loopback and
# shared memory) and optionally PyTorch-Gloo, allreduce float32 sum.
#
#   bench/peers/run.sh --gorovod PATH [--sizes 4K,256K,4M,64M] [--np "2 4"]
#                      [--reps 5] [--load "idle busy"] [--impls LIST]
#                      [--compare LABEL=PATH]... [--gorovod-args "..."]
#                      [--iters 20] [--warmup 5] [--batch-time-us 1000]
#                      [--patterns "batched single"]
#                      [--timeout 1800] [--out FILE] [--table]
#
# Every program run measures ONE size (its own median of --iters samples);
# for each size all the implementations run back to back, in an order that
# rotates from size to size and from rep to rep, so slow drifts of the machine
# hit them alike. The whole sweep is repeated --reps times; table.py reports,
# per implementation, the median over reps and the spread (min-max), and the
# paired ratios gorovod/peer of the same rep. --load "idle busy" runs each rep
# twice: as is, and with one busy-looping process (one core taken).
# --patterns "batched single" runs each size in two patterns, interleaved:
# batched (the default: a sample runs collectives smaller than
# --batch-time-us back to back, the figure of a stream of small messages) and
# single (every sample is one allreduce after a barrier, as a training step
# that computes and then reduces: batch time 0); table.py reports them apart.
#
# Implementations (--impls, comma list; default gorovod-tcp,gorovod-shm,mpi-tcp,mpi-shm):
#   gorovod-tcp, gorovod-shm   `gorovod bench allreduce --transport tcp|shm`
#   mpi-tcp, mpi-shm           Open MPI, --mca btl tcp,self (on lo) | vader,self
#   gloo                       PyTorch torch.distributed Gloo (slow to start: ~4 s a run)
# --compare LABEL=PATH adds another gorovod binary (an older build, say) as
# LABEL-tcp and LABEL-shm, interleaved like the rest: an A/B test.
#
# stdout: one JSON line per run (gorovod's `bench --json` fields plus "impl",
# "rep", "load"), after a first {"meta": ...} line naming the date, machine and
# command; --out FILE also writes them there; --table prints the tables on stderr.
#
# Needs: apt-get install python3-torch openmpi-bin libopenmpi-dev (see README.md).
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3 # Debian's python: the one python3-torch installs into

min_bytes="" max_bytes="" factor=4 sizes="4K,256K,4M,64M" iters=20 warmup=5
nps="2 4" impls="gorovod-tcp,gorovod-shm,mpi-tcp,mpi-shm" batch_us=1000 patterns="batched"
gorovod="" gorovod_args="" timeout_s=1800 table=0 reps=5 loads="idle" out=""
compares=()
command_line="$0 $*"

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
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
    --patterns) patterns=${2//,/ }; shift 2 ;;
    --gorovod) gorovod=$2; shift 2 ;;
    --gorovod-args) gorovod_args=$2; shift 2 ;; # extra words appended to every gorovod call
    --compare) compares+=("$2"); shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --load) loads=${2//,/ }; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --table) table=1; shift ;;
    -h|--help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
done

log() { echo "run.sh: $*" >&2; }
die() { log "$*"; exit 2; }

# Sizes: --sizes, or a geometric series from --min-bytes to --max-bytes.
to_bytes() {
  local s=${1^^} m=1
  s=${s%IB}; s=${s%B}
  case "$s" in *K) m=1024; s=${s%K} ;; *M) m=$((1 << 20)); s=${s%M} ;; *G) m=$((1 << 30)); s=${s%G} ;; esac
  [[ "$s" =~ ^[0-9]+$ ]] || die "bad size $1"
  echo $((s * m))
}
if [ -n "$min_bytes" ] || [ -n "$max_bytes" ]; then
  lo=$(to_bytes "${min_bytes:-4K}") hi=$(to_bytes "${max_bytes:-64M}")
  [ "$factor" -ge 2 ] 2>/dev/null || die "--factor must be at least 2"
  size_list=()
  for ((b = lo; b <= hi; b *= factor)); do size_list+=("$b"); [ "$b" -eq 0 ] && break; done
else
  size_list=()
  for s in ${sizes//,/ }; do size_list+=("$(to_bytes "$s")"); done
fi
[ ${#size_list[@]} -gt 0 ] || die "no sizes"
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive number"
for l in $loads; do case "$l" in idle|busy) ;; *) die "--load takes idle and/or busy, not $l" ;; esac; done
for p in $patterns; do case "$p" in batched|single) ;; *) die "--patterns takes batched and/or single, not $p" ;; esac; done
[[ "$batch_us" =~ ^[0-9]+$ ]] || die "--batch-time-us must be a number of microseconds"

# The implementations to run: name -> how.
declare -A gorovod_bin=()
impl_list=()
for i in ${impls//,/ }; do
  case "$i" in
    gorovod-tcp|gorovod-shm) [ -n "$gorovod" ] || die "$i needs --gorovod PATH"; gorovod_bin[gorovod]=$gorovod ;;
    mpi-tcp|mpi-shm|gloo) ;;
    *) die "unknown implementation $i" ;;
  esac
  impl_list+=("$i")
done
for c in "${compares[@]}"; do
  label=${c%%=*} path=${c#*=}
  [[ "$c" == *=* && "$label" =~ ^[A-Za-z0-9_.]+$ ]] || die "--compare wants LABEL=PATH, got $c"
  gorovod_bin[$label]=$path
  for i in "${impl_list[@]}"; do
    case "$i" in gorovod-*) impl_list+=("$label-${i#gorovod-}") ;; esac
  done
done
for label in "${!gorovod_bin[@]}"; do
  [ -x "${gorovod_bin[$label]}" ] || die "$label: ${gorovod_bin[$label]} is not an executable file"
done

tmp=$(mktemp -d)
busy_pid=""
cleanup() {
  if [ -n "$busy_pid" ]; then kill "$busy_pid" 2>/dev/null; wait "$busy_pid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
results=$tmp/results.jsonl
: >"$results"
[ -z "$out" ] || : >"$out" || die "cannot write $out"

emit() { # one JSON line to stdout, the results file and --out
  printf '%s\n' "$1"
  printf '%s\n' "$1" >>"$results"
  [ -z "$out" ] || printf '%s\n' "$1" >>"$out"
}

# --- preflight ---------------------------------------------------------------
want_mpi=0 want_gloo=0
for i in "${impl_list[@]}"; do
  case "$i" in mpi-*) want_mpi=1 ;; gloo) want_gloo=1 ;; esac
done
if [ "$want_gloo" = 1 ] && ! "$PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  die "gloo: $PY cannot import torch with Gloo (apt-get install python3-torch)"
fi
if [ "$want_mpi" = 1 ]; then
  command -v mpicc >/dev/null && command -v mpirun >/dev/null || die "MPI: no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)"
  mpicc -O2 -o "$tmp/mpi_allreduce" "$HERE/mpi_allreduce.c" || die "mpicc failed"
fi

# Open MPI refuses to run as root unless told it may; np > cores needs
# --oversubscribe (MPI then yields when idle instead of spinning). The TCP BTL
# leaves out 127.0.0.0/8 by default and would talk over eth0, so pin it (and
# the runtime's OOB) to lo. Debian's openmpi-mca-params.conf already disables
# ucx/ofi/openib; pml ob1 is named anyway so the transport is exactly the one
# the label says.
mpirun_base=(mpirun --oversubscribe --bind-to none --mca oob_tcp_if_include lo --mca pml ob1)
[ "$(id -u)" = 0 ] && mpirun_base+=(--allow-run-as-root)
mpi_btl_tcp=(--mca btl tcp,self --mca btl_tcp_if_include lo)
mpi_btl_shm=(--mca btl vader,self)

# The record of what ran where.
meta=$(RUN_COMMAND="$command_line" RUN_GIT=$(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown) \
  RUN_IMPLS="${impl_list[*]}" RUN_NP="$nps" RUN_SIZES="${size_list[*]}" RUN_REPS="$reps" RUN_LOAD="$loads" \
  RUN_ITERS="$iters" RUN_WARMUP="$warmup" RUN_BATCH="$batch_us" RUN_PATTERNS="$patterns" "$PY" -c '
import datetime, json, os, platform
e = os.environ
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(json.dumps({"meta": {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(), "cpu": cpu,
    "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    "loadavg_at_start": os.getloadavg()[0], "git": e["RUN_GIT"], "command": e["RUN_COMMAND"],
    "impls": e["RUN_IMPLS"].split(), "np": [int(x) for x in e["RUN_NP"].split()],
    "sizes": [int(x) for x in e["RUN_SIZES"].split()], "reps": int(e["RUN_REPS"]),
    "load": e["RUN_LOAD"].split(), "iters": int(e["RUN_ITERS"]), "warmup": int(e["RUN_WARMUP"]),
    "batch_time_us": int(e["RUN_BATCH"]), "patterns": e["RUN_PATTERNS"].split()}}))')
emit "$meta"

failed=0
tag() { # tag IMPL REP LOAD PATTERN: JSON lines get impl (if missing), rep, load and pattern; other lines go to stderr
  local impl=$1 rep=$2 load=$3 pattern=$4 line
  while IFS= read -r line; do
    case "$line" in
      "{"*)
        case "$line" in *'"impl"'*) ;; *) line="{\"impl\": \"$impl\", ${line#\{}" ;; esac
        emit "{\"rep\": $rep, \"load\": \"$load\", \"pattern\": \"$pattern\", ${line#\{}" ;;
      *) printf '[%s] %s\n' "$impl" "$line" >&2 ;;
    esac
  done
}

run_one() { # run_one IMPL NP BYTES REP LOAD PATTERN
  local impl=$1 np=$2 b=$3 rep=$4 load=$5 pattern=$6 cmd
  local batch=$batch_us
  [ "$pattern" = single ] && batch=0
  local common=(--sizes "$b" --warmup "$warmup" --iters "$iters" --batch-time-us "$batch")
  case "$impl" in
    mpi-tcp) cmd=("${mpirun_base[@]}" "${mpi_btl_tcp[@]}" -np "$np" "$tmp/mpi_allreduce" --impl mpi-tcp "${common[@]}") ;;
    mpi-shm) cmd=("${mpirun_base[@]}" "${mpi_btl_shm[@]}" -np "$np" "$tmp/mpi_allreduce" --impl mpi-shm "${common[@]}") ;;
    gloo) cmd=(env GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-lo}" "$PY" "$HERE/gloo_allreduce.py" --np "$np" "${common[@]}") ;;
    *-tcp|*-shm)
      # shellcheck disable=SC2206  # gorovod_args is a word list on purpose
      cmd=("${gorovod_bin[${impl%-*}]}" bench allreduce --np "$np" --min-bytes "$b" --max-bytes "$b"
        --warmup "$warmup" --iters "$iters" --batch-time "${batch}us" --transport "${impl##*-}" --json $gorovod_args) ;;
  esac
  timeout --kill-after=10 "$timeout_s" "${cmd[@]}" 2>&1 | tag "$impl" "$rep" "$load" "$pattern"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then log "$impl np=$np $b bytes rep $rep ($load, $pattern) FAILED (exit $rc): ${cmd[*]}"; failed=1; fi
}

start_busy() { # one process that keeps one core busy, as other work would
  ( trap 'exit 0' TERM; while :; do :; done ) &
  busy_pid=$!
}
stop_busy() {
  [ -n "$busy_pid" ] || return 0
  kill "$busy_pid" 2>/dev/null; wait "$busy_pid" 2>/dev/null; busy_pid=""
}

# --- sweep -------------------------------------------------------------------
n=${#impl_list[@]} turn=0 t0=$SECONDS
for ((rep = 1; rep <= reps; rep++)); do
  for load in $loads; do
    log "rep $rep/$reps, $load ($((SECONDS - t0))s so far)"
    [ "$load" = busy ] && start_busy
    for np in $nps; do
      for b in "${size_list[@]}"; do
        for pattern in $patterns; do
          for ((k = 0; k < n; k++)); do
            run_one "${impl_list[$(((k + turn) % n))]}" "$np" "$b" "$rep" "$load" "$pattern"
          done
          turn=$((turn + 1))
        done
      done
    done
    stop_busy
  done
done
log "done in $((SECONDS - t0))s"

if [ "$table" = 1 ]; then
  echo >&2
  "$PY" "$HERE/table.py" "$results" >&2
fi
exit "$failed"
