// Package goodput owns the models behind AdaptDL / Pollux's goodput (Qiao et
// al., OSDI'21): goodput = throughput × statistical efficiency, and what a job
// and a scheduler decide with it.
//
//   - Estimator: the gradient noise estimator. Fed, once per step, a few
//     squared norms the sync layer measures where the gradients pass (each
//     micro-batch's local gradient before the allreduce, the averaged gradient
//     after it; with one micro-batch, two consecutive steps), it keeps the
//     bias-corrected exponential moving averages of the gradient's square and
//     variance (GradParams).
//   - GradParams: statistical efficiency E(M) = (φ+M0)/(φ+M), the AdaScale
//     gain, and the learning-rate rules (AdaScale, square root, linear).
//   - PerfParams: Pollux's seven-parameter throughput model, T_iter(nodes,
//     replicas, micro-batch, accumulation), and Fit / Profile, which fit it
//     to measured step and sync times with gonum's BFGS; a Profile's
//     Entries, its sums per configuration, are what a job's status records
//     and a later driver of the job adds back (AddEntry, which bounds them).
//   - Model: goodput(nodes, replicas, m, s), and Optimize / Reconsider, the
//     batch-size and accumulation search (a geometric grid of global batch
//     sizes; a switch only for a predicted speed-up above SwitchSpeedup).
//
// Everything evaluated per step or per scheduling candidate (Estimator.Observe,
// Model.Goodput, Model.Optimize) is allocation-free; Fit allocates and runs in
// about a millisecond, meant for a periodic refit off the training path.
//
// The package measures nothing itself: package sync feeds the estimator and
// the profile, the training loop applies the batch size and learning-rate
// factor, and the goodput heuristic (package heuristics) and the Pollux
// simulator choose worker counts with Model.
package goodput
