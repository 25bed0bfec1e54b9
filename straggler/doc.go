// Package straggler finds workers that slow their world down and decides when
// replacing one is worth trying again.
//
// Detection follows Or, Zhang and Freedman: each step, every worker's
// throughput (its samples over its compute time — the part of the step it did
// not spend waiting for the others) is divided by the median of the world's;
// an exponentially weighted moving average (α = 0.1) of that ratio below a
// threshold (0.8) for a sustained number of steps flags the worker. The first
// steps after a world change are not counted, and a world change restarts the
// averages, since every worker's share of the batch changes with it.
//
// Replacement is the engine's (package heuristics): it starts a new worker
// first and removes the straggler once the new one is in the world, so the
// world never shrinks in between. Policy here only rations it: a slot whose
// replacement turns out to be slow as well is retried after a back-off that
// doubles each time, up to a limit, so a problem that follows the slot (a
// slow host, a slow rank of the trainer) is not replaced forever.
package straggler
