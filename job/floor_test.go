package job_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
)

// The floor under MinWorkers (floor, minimum.go) is one mechanism whatever took
// the job below it: a lost worker (kill -9) is replaced at once with
// ReplaceLost and once the shortage has been seen on two ticks without; a
// worker that exits by itself (status 0, never a member) is replaced once
// the shortage has been seen twice; a job above its minimum gets no
// replacement.
func TestFloorUnderMinWorkers(t *testing.T) {
	const tick = 500 * time.Millisecond // minimumCheck
	for _, tc := range []struct {
		name         string
		modes        string // per launch index; the last repeats
		workers      int
		min          int
		replaceLost  bool
		wantReplaced int
		// confirmed: the replacement waits for two looks, a tick apart.
		confirmed bool
	}{
		{name: "lost, ReplaceLost", modes: "train,kill,train", workers: 2, min: 2, replaceLost: true, wantReplaced: 1},
		{name: "lost, without ReplaceLost", modes: "train,kill,train", workers: 2, min: 2, wantReplaced: 1, confirmed: true},
		{name: "exited by itself", modes: "train,exit,train", workers: 2, min: 2, replaceLost: true, wantReplaced: 1, confirmed: true},
		{name: "above the minimum", modes: "train,kill,train", workers: 3, min: 2, replaceLost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, tc.workers, envModes+"="+tc.modes, envSteps+"=60", envStepTime+"=20ms")
			cfg.MinWorkers, cfg.ReplaceLost = tc.min, tc.replaceLost
			o, err := run(t, cfg)
			evs := r.all()
			if err != nil {
				t.Fatalf("job failed: %v\n%s", err, describe(evs))
			}
			replaced := len(o.Workers) - tc.workers
			if replaced != tc.wantReplaced {
				t.Fatalf("%d replacements, want %d\n%s", replaced, tc.wantReplaced, describe(evs))
			}
			if tc.wantReplaced == 0 {
				return
			}
			if !o.TrainingFinished || o.Count(job.Finished) < tc.min {
				t.Fatalf("outcome %+v", o)
			}
			// From the exit of worker 1 to the start of its replacement.
			var exited, started time.Time
			for _, e := range evs {
				switch e := e.(type) {
				case job.WorkerExited:
					if e.Worker.Index == 1 {
						exited = e.Time
					}
				case job.WorkerStarted:
					if e.Worker.Index == tc.workers {
						started = e.Time
					}
				}
			}
			wait := started.Sub(exited)
			t.Logf("worker 1 exited (%s); its replacement started %v later", o.Workers[1].State, wait.Round(time.Millisecond))
			if tc.confirmed && wait < tick {
				t.Errorf("replaced after %v: a shortage without a loss must be seen on two ticks, %v apart", wait, tick)
			}
			if !slices.ContainsFunc(evs, func(e job.Event) bool {
				n, ok := e.(job.Notice)
				return ok && strings.Contains(n.Message, "fewer than its minimum 2: started 1 more")
			}) {
				t.Errorf("no notice of the replacement:\n%s", describe(evs))
			}
		})
	}
}

// The floor starts no worker once the job has failed (rule 5), nor after
// three replacements in a row were lost before they joined (a host that
// kills every worker it gets), whether it acts on losses at once
// (ReplaceLost) or after two looks: it must not start workers forever. The
// worker left alone under MinWorkers 2 never trains, so the test ends the
// job once the floor had its chance.
func TestFloorStartsNone(t *testing.T) {
	failed := func(evs []job.Event) bool {
		return slices.ContainsFunc(evs, func(e job.Event) bool {
			x, ok := e.(job.WorkerExited)
			return ok && x.State == job.Failed
		})
	}
	struck := func(evs []job.Event) bool {
		return slices.ContainsFunc(evs, func(e job.Event) bool {
			n, ok := e.(job.Notice)
			return ok && strings.Contains(n.Message, "3 replacements in a row were lost before they joined: no more replacements")
		})
	}
	for _, tc := range []struct {
		name        string
		modes       string // per launch index; the last repeats
		replaceLost bool
		until       func([]job.Event) bool
		launched    int
	}{
		{"a failed worker", "train,fail,train", true, failed, 2},
		{"three strikes, ReplaceLost", "train,kill", true, struck, 2 + 3},
		{"three strikes, without ReplaceLost", "train,kill", false, struck, 2 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, 2, envModes+"="+tc.modes)
			cfg.MinWorkers, cfg.ReplaceLost = 2, tc.replaceLost
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			j, err := job.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			r.waitFor(t, tc.name, tc.until)
			// Not a wait for a condition: three more ticks in which a floor
			// that kept going would start another worker.
			time.Sleep(3 * 500 * time.Millisecond)
			cancel()
			o, _ := j.Wait()
			if len(o.Workers) != tc.launched {
				t.Fatalf("%d workers launched, want %d\n%s", len(o.Workers), tc.launched, describe(r.all()))
			}
		})
	}
}

// A job below its minimum that the floor will not restore — a worker failed,
// or three replacements in a row were lost before they joined — can never
// form a world again: the job ends by itself, its other workers stopped,
// with a notice saying why, instead of waiting for a world until its
// context ends.
func TestFloorEndsStrandedJob(t *testing.T) {
	for _, tc := range []struct {
		name, modes string
		err         string
		why         string
	}{
		{"a failed worker", "train,fail", "job failed: worker 1: exit status 3", "a worker failed, and failed workers are not replaced"},
		{"three strikes", "train,kill", "job failed: no worker finished", "3 replacements in a row were lost before they joined (killed, or stopped as unresponsive)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, 2, envModes+"="+tc.modes)
			cfg.MinWorkers, cfg.ReplaceLost = 2, true
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			o, err := job.Run(ctx, cfg)
			if ctx.Err() != nil {
				t.Fatalf("the job ran until its context ended: %v\n%s", ctx.Err(), describe(r.all()))
			}
			if err == nil || err.Error() != tc.err {
				t.Fatalf("error %v, want %q\n%s", err, tc.err, describe(r.all()))
			}
			if w := o.Workers[0]; w.State != job.Stopped || w.StopReason != job.StopStranded {
				t.Fatalf("worker 0 %v (%v), want stopped (stranded)\n%s", w.State, w.StopReason, describe(r.all()))
			}
			if n := o.CountStopped(job.StopNotNeeded); n != 0 {
				t.Fatalf("%d workers stopped as not needed any more, in a job that could not go on\n%s", n, describe(r.all()))
			}
			exitedStranded := slices.ContainsFunc(r.all(), func(e job.Event) bool {
				x, ok := e.(job.WorkerExited)
				return ok && x.Worker.Index == 0 && x.StopReason == job.StopStranded
			})
			if !exitedStranded {
				t.Fatalf("worker 0's exit event does not say it was stopped because the job was stranded\n%s", describe(r.all()))
			}
			told := slices.ContainsFunc(r.all(), func(e job.Event) bool {
				n, ok := e.(job.Notice)
				return ok && strings.Contains(n.Message, "fewer than its minimum 2, and "+tc.why+": no world can form, so the job ends")
			})
			if !told {
				t.Fatalf("no notice says why the job ended\n%s", describe(r.all()))
			}
		})
	}
}
