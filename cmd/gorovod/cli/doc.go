// Package cli is the gorovod command line as a library: `run`, the flags,
// display and exit status around package job's runner (which owns the job:
// its driver, its local workers, its autoscaling engine and the rules that
// end it), and `bench` (collective benchmarks across local processes). The
// gorovod command is a one-line main around Run; a program that adds its own
// Go heuristics passes a registry holding them in Config.Heuristics and gets
// the same command line with `--heuristic NAME` choosing them
// (examples/custom-launcher). A program that runs jobs without a command
// line calls package job directly.
//
// On a Kubernetes cluster shared by the gorovod scheduler, `run
// --gorovodjob NAME` is a GorovodJob's driver (gorovodjob.go: its spec's
// workers on the nodes of its status.allocation, followed live; a
// replacement driver pod takes the running job back from status.adoption:
// gorovodjob_adopt.go), and
// `submit`, `jobs`, `logs` and `delete` (jobs.go) are the user's commands for
// GorovodJobs, finding the cluster as kubectl does (kubeclient.go).
package cli
