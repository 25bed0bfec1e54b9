// Package launch starts worker processes: one at a time on this host
// (StartProcess, what the job runner's local launcher uses) or as a set (Start,
// what `gorovod bench` uses) on this host or on others over ssh (see SSH),
// with the environment the caller gives each, every line they print routed
// through one callback, workers added while the job runs, signals forwarded,
// and a stop signal followed by SIGKILL when their context ends.
package launch
