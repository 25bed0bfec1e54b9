// Package sync is gorovod's trainer-facing elastic layer: what a training loop
// calls every step to average its gradients with the other workers, and what
// keeps that working while workers join, leave and fail.
//
// Today it holds the building blocks: Fuser packs many gradient tensors into few
// allreduces (Horovod's fusion buffer), AsyncReducer overlaps their
// communication with the backward pass, and Sampler shards a data epoch across
// a changing number of workers without skipping or repeating a sample. The
// session that agrees on world epochs and hot-swaps the communicator at a step
// boundary builds on them (issue #3).
package sync
