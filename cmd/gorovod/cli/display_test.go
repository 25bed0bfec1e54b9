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
