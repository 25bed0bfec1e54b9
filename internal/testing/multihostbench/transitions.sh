#!/usr/bin/env bash
# Planned transitions over the namespaced test hosts, two revisions
# interleaved: the graceful leave and the join of TestMeasureHostTransitions
# (16 workers unless NP says otherwise), run alternately for revision A and
# revision B, ROUNDS times each; then TestTransitionBreakdown's phases for
# each. Needs root (internal/testing/testhosts). Usage, from the repository root:
#
#   internal/testing/multihostbench/transitions.sh [A-rev [B-rev]]   # default: main and HEAD
#
# Environment: NP (the world subtest of TestMeasureHostTransitions: 4, 8 or
# 16; default 16), ROUNDS (default 3), OUT (default /tmp/gorovod-transitions).
# Each run's whole output stays in OUT (REV-measure-I.log, REV-breakdown.log);
# a failed run is reported with the end of its log, and the script then exits
# non-zero.
set -euo pipefail
A=${1:-main}
B=${2:-HEAD}
NP=${NP:-16}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/gorovod-transitions}
case "$NP" in
4 | 8 | 16) ;;
*)
	echo "NP=$NP: TestMeasureHostTransitions has worlds of 4, 8 and 16 workers" >&2
	exit 2
	;;
esac
mkdir -p "$OUT"
root=$(git rev-parse --show-toplevel)
dirA=$OUT/src-A
dirB=$OUT/src-B
cleanup() {
	git -C "$root" worktree remove --force "$dirA" 2>/dev/null || true
	git -C "$root" worktree remove --force "$dirB" 2>/dev/null || true
}
trap cleanup EXIT
build() { # rev dir
	rm -rf "$2"
	git -C "$root" worktree add -q --detach "$2" "$1"
	# The same measurement for both revisions: this tree's harness (the
	# end-to-end tests' helpers and the multi-host tests, cmd/gorovod/e2e,
	# and the synthetic trainer that prints each step's time) over each
	# revision's library and launcher.
	rm -rf "$2/cmd/gorovod/e2e"
	cp -r "$root/cmd/gorovod/e2e" "$2/cmd/gorovod/e2e"
	cp "$root/examples/synthetic/main.go" "$2/examples/synthetic/"
	(cd "$2" && go test -c -o "$OUT/$1.test" ./cmd/gorovod/e2e/hosts)
}
# run LOG PATTERN LABEL SUMMARY CMD...: runs one measurement from
# $dir/cmd/gorovod/e2e/hosts, keeps its whole output in LOG and prints the
# lines that match PATTERN, adding them to SUMMARY. A run that fails (a test failure, or
# no matching line) is reported with the end of its log and counted, and the
# others still run. (Called outside any pipeline, so that the count stays in
# this shell.)
failed=0
run() {
	local log=$1 pattern=$2 label=$3 summary=$4
	shift 4
	if ! (cd "$dir/cmd/gorovod/e2e/hosts" && "$@") >"$log" 2>&1 || ! grep -qE "$pattern" "$log"; then
		echo "$label: FAILED, the end of $log:" >&2
		tail -n 20 "$log" >&2
		failed=$((failed + 1))
	fi
	grep -E "$pattern" "$log" | sed "s/^/$label: /" | tee -a "$summary" || true
}
build "$A" "$dirA"
build "$B" "$dirB"
for i in $(seq "$ROUNDS"); do
	for rev in "$A" "$B"; do
		dir=$dirA
		[ "$rev" = "$B" ] && dir=$dirB
		run "$OUT/$rev-measure-$i.log" 'graceful leave|join \(' "$rev run $i" "$OUT/measure.txt" \
			env GOROVOD_MEASURE_TRANSITIONS=1 "$OUT/$rev.test" -test.run "TestMeasureHostTransitions/^$NP\$" -test.v
	done
done
for rev in "$A" "$B"; do
	dir=$dirA
	[ "$rev" = "$B" ] && dir=$dirB
	run "$OUT/$rev-breakdown.log" ' (leave|join): ' "$rev breakdown" "$OUT/breakdown.txt" \
		env GOROVOD_MEASURE_TRANSITIONS=1 GOROVOD_MEASURE_NP="$NP" "$OUT/$rev.test" -test.run TestTransitionBreakdown -test.v
done
if [ "$failed" -gt 0 ]; then
	echo "$failed of the runs failed; their logs are in $OUT" >&2
	exit 1
fi
