// Package fusion packs many gradient tensors into few collectives (Horovod's
// tensor fusion) and runs them in the background so that communication
// overlaps the backward pass.
package fusion
