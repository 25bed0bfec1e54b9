package job_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// A worker the driver removed as stuck (blamed for the failures of several
// worlds while it answered its probes) is never admitted again under its
// name, yet its process lives on: the runner stops it (StopSignal, then
// SIGKILL after RemoveGrace for one that ignores it) and the floor starts
// another in its place, so a job at its minimum is not left waiting for a
// world with the stuck process counted as a live worker. The driver is a
// fake that reports the removal, as the real one's proposer does
// (epoch.ReasonStuck); the processes are real.
func TestStuckWorkerIsStoppedAndReplaced(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stuckMode   string // worker 1's mode
		replaceLost bool
		wantKill    bool // it ignores StopSignal: SIGKILL ends it
	}{
		{name: "exits on the stop signal, ReplaceLost", stuckMode: "wait", replaceLost: true},
		{name: "exits with status 0 on the stop signal", stuckMode: "waitok"},
		{name: "ignores the stop signal", stuckMode: "deaf", wantKill: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, 2, envModes+"=wait,"+tc.stuckMode+",wait")
			cfg.MinWorkers, cfg.ReplaceLost, cfg.RemoveGrace = 2, tc.replaceLost, time.Minute
			if tc.wantKill {
				cfg.RemoveGrace = 300 * time.Millisecond
			}
			d := &fakeDriver{finished: make(chan struct{}), launch: "0",
				world: epoch.World{Number: 3, Members: []epoch.Member{{Name: "w0"}, {Name: "w1"}}}}
			hooks := make(chan driver.Config, 1)
			cfg.StartDriver = func(_ context.Context, dc driver.Config) (job.Driver, error) {
				hooks <- dc
				return d, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			j, err := job.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			dc := <-hooks
			if dc.OnRemoved == nil {
				cancel()
				_, _ = j.Wait()
				t.Fatal("the runner gives the driver no OnRemoved hook: it cannot learn of a worker removed as stuck")
			}
			r.waitFor(t, "both workers waiting", saidLine("waiting", 2))
			// Other removals are the driver's business: the process of a
			// worker removed as unanswered has died or will come back.
			dc.OnRemoved("w0", epoch.ReasonUnanswered)
			dc.OnRemoved("w1", epoch.ReasonStuck)
			r.waitFor(t, "worker 1 stopped and a replacement started", func(evs []job.Event) bool {
				exited, replaced := false, false
				for _, e := range evs {
					switch e := e.(type) {
					case job.WorkerExited:
						exited = exited || e.Worker.Index == 1
					case job.WorkerStarted:
						replaced = replaced || e.Worker.Index == 2
					}
				}
				return exited && replaced
			})
			cancel()
			o, _ := j.Wait()
			evs := r.all()
			if len(o.Workers) != 3 {
				t.Fatalf("%d workers launched, want 3 (two and one replacement)\n%s", len(o.Workers), describe(evs))
			}
			if w := o.Workers[1]; w.State != job.Stopped || w.StopReason != job.StopStuck {
				t.Errorf("worker 1 (stuck) ended %v, %v (%v), want stopped as stuck", w.State, w.StopReason, w.Err)
			}
			killed := slices.ContainsFunc(evs, func(e job.Event) bool {
				n, ok := e.(job.Notice)
				return ok && strings.Contains(n.Message, "removed as stuck, did not exit") && strings.Contains(n.Message, "SIGKILL")
			})
			if killed != tc.wantKill {
				t.Errorf("SIGKILL sent: %v, want %v\n%s", killed, tc.wantKill, describe(evs))
			}
			if w0 := o.Workers[0]; w0.Exited.Before(o.Workers[2].Started) {
				t.Errorf("worker 0 exited (%v) before the replacement started: a removal not as stuck stopped it\n%s", w0.State, describe(evs))
			}
		})
	}
}

// saidLine is a waitFor condition: n lines of the workers' output are line.
func saidLine(line string, n int) func(evs []job.Event) bool {
	return func(evs []job.Event) bool {
		said := 0
		for _, e := range evs {
			if o, ok := e.(job.WorkerOutput); ok && string(o.Line) == line {
				said++
			}
		}
		return said == n
	}
}
