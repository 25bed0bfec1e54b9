// Package steer owns the heuristic through which a cluster allocator drives
// one elastic job: it moves the job's world to the size the allocator gave it
// (its target) and, on the autoscaling engine's goroutine where the job's
// history lives, fits the job's goodput model (heuristics.FitGoodput) for the
// allocator's next round — for a driver that took a running job over, to the
// profile the driver before it recorded as well (Config.Recorded). The local
// pool of `gorovod cluster` (package cluster/pool) and a GorovodJob's driver
// on Kubernetes (`gorovod run --gorovodjob`) both steer their jobs with it.
package steer
