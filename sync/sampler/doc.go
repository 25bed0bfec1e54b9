// Package sampler shards a data set across the workers of an elastic job so
// that, within a data epoch, every sample is processed exactly once by the
// world as a whole however often the world is resized or a step is redone.
// Its whole state is a small Position (data epoch, samples committed) that is
// identical on every rank: the elastic layer broadcasts it to joining workers
// with the rest of the training state (see sync.State.RegisterBlob).
package sampler
