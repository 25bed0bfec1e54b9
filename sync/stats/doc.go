// Package stats is what workers measure of their own training steps for the
// driver's autoscaling engine: per-step timings (Step), sent in batches
// (Batch), and the Clock a session times its steps with at the cost of two
// clock reads per step.
package stats
