package job

import (
	"slices"

	"github.com/gorovod/gorovod/sync/epoch"
)

// handStarted is what the runner knows of the workers that joined the job
// without being launched by it (`gorovod attach`, a trainer started by hand
// with the job file): their member names, in the order they joined, and
// which members the driver took out of the world because they had finished
// training (epoch.ReasonFinished). Only the hand-started need that last:
// the exit of a launched process says how it ended. The roster's mu guards
// it.
type handStarted struct {
	names []string // members that joined without being launched
	// doneEarly: members the driver took out of the world because they
	// had finished training while others redid the last step
	// (epoch.Rescued).
	doneEarly map[string]bool
}

func newHandStarted() handStarted { return handStarted{doneEarly: map[string]bool{}} }

// add records name, a member that joined a world and that no process of
// the job is behind, and reports whether it is new.
func (h *handStarted) add(name string) bool {
	if slices.Contains(h.names, name) {
		return false
	}
	h.names = append(h.names, name)
	return true
}

// finishedEarly records that the driver took member name out of the world
// because it had finished training (the others redo the last step).
func (h *handStarted) finishedEarly(name string) { h.doneEarly[name] = true }

// final describes the hand-started workers at the job's end: whether each
// is in last, the last world, and whether it finished training (in the
// last world when training was over, or taken out having finished).
func (h *handStarted) final(last epoch.World, trainingOver bool) []HandStartedWorker {
	var out []HandStartedWorker
	for _, name := range h.names {
		in := last.Rank(name) >= 0
		out = append(out, HandStartedWorker{Name: name, InLastWorld: in,
			Finished: (in && trainingOver) || h.doneEarly[name]})
	}
	return out
}
