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
set -euo pipefail
A=${1:-main}
B=${2:-HEAD}
NP=${NP:-16}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/gorovod-transitions}
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
	# tests, and the synthetic trainer that prints each step's time) over
	# each revision's library and launcher.
	for f in main_test.go run_test.go hosts_test.go transition_breakdown_test.go; do
		cp "$root/cmd/gorovod/$f" "$2/cmd/gorovod/"
	done
	cp "$root/examples/synthetic/main.go" "$2/examples/synthetic/"
	(cd "$2" && go test -c -o "$OUT/$1.test" ./cmd/gorovod)
}
build "$A" "$dirA"
build "$B" "$dirB"
for i in $(seq "$ROUNDS"); do
	for rev in "$A" "$B"; do
		dir=$dirA
		[ "$rev" = "$B" ] && dir=$dirB
		(cd "$dir/cmd/gorovod" && GOROVOD_MEASURE_TRANSITIONS=1 "$OUT/$rev.test" \
			-test.run "TestMeasureHostTransitions/^$NP\$" -test.v 2>&1) |
			grep -E 'graceful leave|join \(' | sed "s/^/$rev run $i: /" | tee -a "$OUT/measure.txt"
	done
done
for rev in "$A" "$B"; do
	dir=$dirA
	[ "$rev" = "$B" ] && dir=$dirB
	(cd "$dir/cmd/gorovod" && GOROVOD_MEASURE_TRANSITIONS=1 GOROVOD_MEASURE_NP=$NP "$OUT/$rev.test" \
		-test.run TestTransitionBreakdown -test.v 2>&1) |
		grep -E ' (leave|join): ' | sed "s/^/$rev breakdown: /" | tee -a "$OUT/breakdown.txt"
done
