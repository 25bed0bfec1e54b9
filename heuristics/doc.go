// Package heuristics owns the autoscaling decisions of an elastic job and the
// engine that carries them out: what has been measured of the job (History,
// built from the per-step reports the workers send), the Heuristic interface a
// policy implements, a Registry selecting policies by name with all-of / any-of
// composition, the built-in policies (throughput scaling efficiency, utility
// versus cost, goodput — AdaptDL / Pollux's fitted throughput × statistical
// efficiency, modelled in package goodput —, a fixed schedule, and exec, which
// runs a policy written in any language), and the Engine that runs in the
// driver, consults the straggler detector and the heuristic every few steps,
// and acts through a Provisioner.
package heuristics
