// Package driver proposes the world epochs of an elastic job: the job's
// driver (the process `gorovod run` runs) is a gossip member that turns
// membership changes and the workers' failure reports into numbered epochs
// and announces them; a worker runs the same proposer when the job has no
// driver (ElectProposer). Coordinator is the in-process form, for workers in
// one process (tests, benchmarks).
package driver
