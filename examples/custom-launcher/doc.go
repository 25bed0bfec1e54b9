// Command custom-launcher is gorovod's command line with one more autoscaling
// policy written in Go, and an example of adding one: register the heuristic
// in a registry and run the command line (package cli) with it. Everything
// `gorovod` does, this does too; `--heuristic marginal-gain` and heuristic
// configuration files (also inside all-of / any-of) now name the new policy.
//
//	go build -o /tmp/gorovod-custom ./examples/custom-launcher
//	/tmp/gorovod-custom run --list-heuristics
//	/tmp/gorovod-custom run --np 1 --max-np 6 --heuristic marginal-gain \
//	    --heuristic-opt min_gain=0.4 -- synthetic --steps 3000
//
// The policy keeps a worker while it pays for itself: the k-th worker's gain
// is the throughput measured with k workers minus that with k−1, and it pays
// when the gain is at least min_gain times the throughput per worker with
// k−1 (1 would be perfect linear scaling). It grows one worker at a time
// until a worker does not pay, goes back one and settles there. (It is the
// policy of examples/heuristic-plugin, the exec version, here in process: no
// JSON, no process per evaluation, and the whole History at hand.)
package main
