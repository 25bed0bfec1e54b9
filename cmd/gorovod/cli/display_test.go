package cli

import (
	"testing"

	"github.com/gorovod/gorovod/job"
)

// The job's last line counts a hand-started worker as finished when it
// finished training, in the last world or not (a worker that completed the
// last step leaves while others redo it without it), and as left otherwise.
func TestCountLineHandStarted(t *testing.T) {
	launched := []job.WorkerRecord{{Name: "a", State: job.Finished}}
	tests := []struct {
		name string
		hand []job.HandStartedWorker
		want string
	}{
		{"in the last world", []job.HandStartedWorker{{Name: "h", InLastWorld: true, Finished: true}},
			"2 workers finished (1 started by hand), 0 lost, 0 failed; last world epoch 0 had 0 workers"},
		{"finished before the others redid the last step", []job.HandStartedWorker{{Name: "h", Finished: true}},
			"2 workers finished (1 started by hand), 0 lost, 0 failed; last world epoch 0 had 0 workers"},
		{"left before the end", []job.HandStartedWorker{{Name: "h"}},
			"1 workers finished, 0 lost, 0 failed, 1 started by hand left before the end; last world epoch 0 had 0 workers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := job.Outcome{TrainingFinished: true, LastStep: 10, Workers: launched, HandStarted: tc.hand}
			if got := countLine(o); got != tc.want {
				t.Errorf("countLine = %q, want %q", got, tc.want)
			}
		})
	}
}

// The job's last line counts the workers whose records the job no longer
// keeps (Outcome.EarlierWorkers) with those it kept.
func TestCountLineEarlierWorkers(t *testing.T) {
	tests := []struct {
		name string
		o    job.Outcome
		want string
	}{
		{"past the bound", job.Outcome{TrainingFinished: true, LastStep: 10,
			Workers:        []job.WorkerRecord{{State: job.Finished}, {State: job.Lost}},
			EarlierWorkers: job.WorkerCounts{Finished: 1, Lost: 700, Failed: 2, Stopped: 3, StoppedBy: map[job.StopReason]int{job.StopNotNeeded: 3}}},
			"2 workers finished, 701 lost, 2 failed, 3 stopped (not needed any more); last world epoch 0 had 0 workers"},
		{"none trained a step, records dropped", job.Outcome{
			Workers:        []job.WorkerRecord{{State: job.Finished}},
			EarlierWorkers: job.WorkerCounts{Finished: 4}},
			"5 workers exited with status 0 but none trained a step"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := countLine(tc.o); got != tc.want {
				t.Errorf("countLine = %q, want %q", got, tc.want)
			}
		})
	}
}

// The job's last line says why the runner stopped the workers it stopped:
// a job that ended because it could not go on must not read as one that
// finished with workers to spare.
func TestCountLineStopReasons(t *testing.T) {
	stopped := func(why job.StopReason) job.WorkerRecord {
		return job.WorkerRecord{State: job.Stopped, StopReason: why}
	}
	tests := []struct {
		name string
		o    job.Outcome
		want string
	}{
		{"stranded below its minimum", job.Outcome{LastStep: 3,
			Workers: []job.WorkerRecord{stopped(job.StopStranded), {State: job.Failed}}},
			"0 workers finished, 0 lost, 1 failed, 1 stopped (the job could not go on: below its minimum for good); last world epoch 0 had 0 workers"},
		{"stopped as unresponsive", job.Outcome{TrainingFinished: true, LastStep: 10,
			Workers: []job.WorkerRecord{{State: job.Finished}, stopped(job.StopUnresponsive)}},
			"1 workers finished, 0 lost, 0 failed, 1 stopped (out of the job's view, paused or hung, and not back when woken); last world epoch 0 had 0 workers"},
		{"every reason, kept and earlier", job.Outcome{TrainingFinished: true, LastStep: 10,
			Workers: []job.WorkerRecord{{State: job.Finished}, stopped(job.StopNotNeeded), stopped(job.StopStuck), stopped(job.StopHostDropped),
				stopped(job.NoStopReason)},
			EarlierWorkers: job.WorkerCounts{Stopped: 3, StoppedBy: map[job.StopReason]int{job.StopHostDropped: 2, job.NoStopReason: 1}}},
			"1 workers finished, 0 lost, 0 failed, 1 stopped (not needed any more), 1 stopped (removed as stuck), 3 stopped (host left the job), " +
				"2 stopped (before this runner took the job back, for a reason the job's record does not give); last world epoch 0 had 0 workers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := countLine(tc.o); got != tc.want {
				t.Errorf("countLine = %q, want %q", got, tc.want)
			}
		})
	}
}
