// Package pool runs many elastic training jobs on one pool of worker slots
// and shares the slots among them with a cluster scheduling policy (package
// scheduler: Pollux, Optimus or Tiresias), live: `gorovod cluster` is its
// command line.
//
// Each job is a job.Job (its own driver, its workers started through the
// job's Launcher). Every Config.Interval the pool measures each running job
// through its autoscaling engine — throughput per world size, and the
// gradient statistics when the trainer reports them — fits the job's goodput
// model (heuristics.FitGoodput, package goodput), asks the policy for an
// allocation of the slots, and carries it out: a job that is given slots for
// the first time starts, a running job grows or shrinks through its engine
// (the pool steers each job with package steer's heuristic, whose target is the
// job's allocation). A round also runs as soon as a job ends, so its slots
// are not idle until the next tick.
//
// What differs from the simulator's world: a gorovod job has no checkpoint to
// be suspended into, so a job, once started, keeps at least its MinWorkers
// slots (the pool admits a job only while every running job's minimum fits);
// the policy's allocation is repaired to that before it is carried out.
// Slots are counted, not pinned: a job shrinking and another growing in the
// same round briefly overlap while the first one's workers leave.
package pool
