// Package metrics exports a gorovod job's measurements in Prometheus's
// format (prometheus/client_golang): Job holds what the driver sees — steps,
// step-time and compute-time histograms, samples and throughput, world size
// and epoch, world changes and how long they took, failures by kind, the
// autoscaling engine's decisions — and Worker what one worker process sees of
// its collectives (operations, bytes, time per collective). Serve exposes a
// registry over HTTP at /metrics, for `gorovod run --metrics-addr`, without
// authentication and with bounds on what one client can hold (connections,
// time per request, idle keep-alive time: ServerConfig).
//
// The recording functions take what the driver and the engine already hand
// around (heuristics.StepReport, heuristics.Event, a world's epoch and size),
// so wiring them is one call at each place: the driver's OnStats and OnEpoch
// callbacks, the engine's OnEvent, the launcher's report of a lost worker.
// Every metric is named gorovod_*; none has a per-worker label, so a long
// elastic job that replaces many workers does not grow the series count.
package metrics
