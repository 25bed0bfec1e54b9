// Command heuristic-plugin is an autoscaling policy for gorovod's exec
// heuristic, and an example of writing one: each evaluation it reads the
// job's history as one JSON object on stdin, prints one decision as JSON on
// stdout and exits (the protocol is in docs/heuristic-plugins.md). It logs
// one line per evaluation to stderr.
//
// The policy keeps a worker while it pays for itself. The gain of the k-th
// worker is the throughput measured with k workers minus that with k-1; it
// pays when the gain is at least --min-gain times the throughput per worker
// with k-1 (1 would be perfect linear scaling). At world size k:
//
//   - no measurement of k workers yet (fewer than --min-steps steady steps):
//     hold and wait;
//   - k-1 was measured and the k-th worker does not pay: shrink by one;
//   - k+1 was measured and the (k+1)-th worker did not pay, or k is the
//     job's maximum: hold, settled;
//   - otherwise grow by one.
//
// Build it and run a job under it:
//
//	go build -o /tmp/heuristic-plugin ./examples/heuristic-plugin
//	gorovod run --np 1 --max-np 6 --heuristic exec \
//	    --heuristic-opt command=/tmp/heuristic-plugin -- synthetic --steps 3000
//
// Its flags go in the command, which the exec heuristic splits at spaces:
//
//	--heuristic-opt 'command=/tmp/heuristic-plugin --min-gain 0.3'
//
// and --heuristic-opt forward_stderr=true shows its log lines in gorovod's.
// To try it by hand, pipe it a history:
//
//	echo '{"protocol":1,"workers":1,"members":["w0"],"measurements":[{"workers":1,"steps":9,"throughput":100}]}' | /tmp/heuristic-plugin
package main
