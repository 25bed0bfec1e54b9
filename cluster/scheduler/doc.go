// Package scheduler owns cluster scheduling of many elastic jobs: which job
// gets how many GPUs on which nodes, round after round. A Policy allocates a
// Cluster (GPUs per node) to the active Jobs; three are provided:
//
//   - Pollux (Qiao et al., OSDI'21): a genetic algorithm over jobs × nodes
//     replica matrices maximizing the power mean (fairness p, −1 by default)
//     of each job's speed-up over its fair share, as predicted by the job's
//     goodput model (Job.Goodput, e.g. from package goodput), with a
//     re-allocation penalty, at most one distributed job per node and at most
//     twice the replicas a job has been measured at; deterministic under a
//     seed, population and generations configurable.
//   - Tiresias (Gu et al., NSDI'19): two-queue discretized least attained
//     service, every job at the size its user asked for.
//   - Optimus (Peng et al., EuroSys'18): greedy marginal gain in remaining
//     time, with the true step times ("oracle").
//
// A job may be kept on some nodes (Job.Eligible): every policy allocates it
// only those, no more replicas than they hold, and where two such jobs want
// the same nodes the one the policy ranks first keeps them; PlaceCounts,
// which makes counts a placement, holds any placement to them too. A job may
// prefer some nodes (Job.Preference, a score per node): where a policy's
// choice of node is open — Pollux's among allocations of equal fitness, the
// baselines' and PlaceCounts' packing — its replicas go to its eligible
// nodes of highest score first; a preference changes no job's count and
// makes no node eligible. A job may be capped per node (Job.MaxPerNode):
// every policy, and PlaceCounts, gives it at most that many replicas on a
// node, and no more in all than its eligible nodes hold so (CapacityFor).
//
// The policies only decide; the caller applies the allocation and measures
// the jobs: package simulator replays Pollux's trace-driven study, and package
// pool shares a pool of slots among real elastic jobs live, feeding their
// fitted goodput models through the same Job type.
package scheduler
