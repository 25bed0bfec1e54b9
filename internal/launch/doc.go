// Package launch starts worker processes on this host: one at a time
// (StartProcess, what the job runner's local launcher uses) or as a fixed set
// (Start, what `gorovod bench` uses), with the environment the caller gives
// each, every line they print routed through one callback, and a stop signal
// followed by SIGKILL when their context ends.
package launch
