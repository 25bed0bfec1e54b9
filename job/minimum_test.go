package job_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/job"
)

// A job below its minimum — a worker killed before any world could form —
// gets a replacement from the runner, since neither the driver (no world
// below the minimum) nor the engine (it acts on worlds) would bring one.
func TestRunnerRestoresMinimum(t *testing.T) {
	r := newRecorder()
	cfg := config(t, r, 2, envModes+"=train,kill,train", envSteps+"=50")
	cfg.MinWorkers = 2
	o, err := run(t, cfg)
	if err != nil {
		t.Fatalf("job failed: %v\n%s", err, describe(r.all()))
	}
	if len(o.Workers) != 3 || o.Count(job.Finished) != 2 || o.Workers[1].State != job.Lost || !o.TrainingFinished {
		t.Fatalf("workers %+v", o.Workers)
	}
	if !slices.ContainsFunc(r.all(), func(e job.Event) bool {
		n, ok := e.(job.Notice)
		return ok && strings.Contains(n.Message, "fewer than its minimum 2: started 1 more")
	}) {
		t.Fatalf("no notice of the replacement:\n%s", describe(r.all()))
	}
}
