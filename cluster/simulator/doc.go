// Package simulator replays cluster workloads against measured traces, as
// Pollux's simulator study does (Qiao et al., OSDI'21; the traces and
// workloads are its published artifact). A Trace holds one model's
// measurements: step and synchronization times by placement and local batch
// size (interpolated for placements not measured) and, per batch size, the
// training progress and gradient statistics of each epoch. Simulate moves
// every job of a workload through its trace in scheduling rounds under a
// policy of package scheduler: jobs make progress at their goodput (the
// statistical efficiency comes from the traced gradient statistics), Pollux's
// jobs fit their throughput models online and pick their batch sizes with
// package goodput, and every reallocation costs a configurable pause (30 s of
// checkpoint-restart in the paper; a running job's live resize, as gorovod
// does it, can be modelled as a short pause after the new workers started).
// The result is each job's completion time, with averages, tails, makespan
// and GPU utilization. Models beyond the six of the study (DefaultModels)
// are configured by a model.json beside their traces (LoadModels), and a
// workload may set a job's own length and replica bounds. Config.Elastic
// carries each round's allocation out as gorovod's scheduler service does
// (no job suspended: running jobs keep their minimums, waiting ones start at
// theirs), and Config.EndCost adds the time from a job's last step to its
// completion. `gorovod simulate` is its command line.
package simulator
