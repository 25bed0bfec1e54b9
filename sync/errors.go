package sync

import "errors"

var (
	// ErrWorldChanged is returned by Session.Allreduce when the world broke
	// during the collective and was rebuilt, and by Session.Commit when the
	// step did not commit after all (the next world's rank 0 had not finished
	// it): the registered state has been made identical on every worker
	// (possibly rolled back to the start of the step), so the trainer
	// recomputes the step from the state it now holds.
	ErrWorldChanged = errors.New("sync: the world changed during the step; redo it")
	// ErrExcluded is returned when a newer epoch no longer includes this worker
	// (it was scaled down, or declared failed while it was unreachable).
	ErrExcluded = errors.New("sync: this worker is not a member of the current world")
	// ErrOutForGood is returned by Worker.Rejoin when the job will not admit
	// the worker again: the driver removed it (a scale-down), or training is
	// over.
	ErrOutForGood = errors.New("sync: the job will not admit this worker again (removed by the driver, or training is over)")
)
