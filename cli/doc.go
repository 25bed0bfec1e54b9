// Package cli is the gorovod command line as a library: `run` (the driver of
// an elastic job, the local launcher of its workers and its autoscaling
// engine) and `bench` (collective benchmarks across local processes). The
// gorovod command is a one-line main around Run; a program that adds its own Go
// heuristics passes a registry holding them in Config.Heuristics and gets the
// same command line with `--heuristic NAME` choosing them
// (examples/custom-launcher).
package cli
