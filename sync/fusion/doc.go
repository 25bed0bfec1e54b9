// Package fusion packs many gradient tensors — any dtype, host or device
// memory — into few collectives (Horovod's tensor fusion: one fusion buffer
// per dtype and memory kind) and runs them in the background so that
// communication overlaps the backward pass.
package fusion
