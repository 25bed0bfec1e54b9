package job_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
)

// A worker process that runs out of the job's view after the first world, in
// a job at its minimum, would keep the job waiting for good: the floor
// counts it as staying and the driver forms no world without it. The runner
// wakes it at WakeAfter once it left the view (a paused worker then trains
// on, with the job's state), or at half of ElasticTimeout if it never joined,
// and stops it as unresponsive a quarter of ElasticTimeout later if it is
// still out (a replacement that hangs before it joins), and the floor
// replaces it; all well before the waiting worker's own ElasticTimeout.
func TestUnresponsiveWorkersAreWokenOrReplaced(t *testing.T) {
	for _, tc := range []struct {
		name  string
		modes string
		// workers and min are the job's size and MinWorkers (2 and 2
		// when 0).
		workers, min int
		// elastic is long enough for a worker under -race to be back (or
		// replaced and joined) before worker 0 gives up waiting for a world.
		elastic time.Duration
		// wake is Config.WakeAfter (the default when 0); when set, every
		// worker woken must have been out for less than half of elastic.
		wake        time.Duration
		wantWoken   []int // launch indexes
		wantStopped []int // stopped as unresponsive
		wantWorkers int   // processes the job launched
	}{
		// Worker 1 pauses itself after step 5: woken, it comes back and
		// both finish.
		{name: "paused worker woken", modes: "train,pausemid", elastic: 10 * time.Second,
			wantWoken: []int{1}, wantWorkers: 2},
		// Worker 1 dies after step 5; its replacement (2) hangs before it
		// joins and ignores the stop signal: woken, stopped with SIGKILL,
		// and replaced by 3, which trains to the end with worker 0.
		{name: "hung replacement stopped", modes: "train,killmid,deaf,train", elastic: 16 * time.Second,
			wantWoken: []int{2}, wantStopped: []int{2}, wantWorkers: 4},
		// Of three workers at --min-np 1, two pause after step 5 and the
		// third dies there: the paused two are most of the last world's
		// voters, so no world forms without them (they may be cut off, not
		// gone), and they count as staying, so the floor starts no one.
		// Both are woken and finish; the dead one is not replaced.
		{name: "two of three paused, the third killed", modes: "pausemid,pausemid,killmid", workers: 3, min: 1,
			elastic: 16 * time.Second, wantWoken: []int{0, 1}, wantWorkers: 3},
		// As the first row, with Horovod's ElasticTimeout (10 min): the
		// paused worker, which joined, is woken WakeAfter after it left the
		// view, not 5 minutes later.
		{name: "paused worker woken at WakeAfter", modes: "train,pausemid", elastic: 10 * time.Minute,
			wake: time.Second, wantWoken: []int{1}, wantWorkers: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			workers, minimum := cmp.Or(tc.workers, 2), cmp.Or(tc.min, 2)
			cfg := config(t, r, workers, envModes+"="+tc.modes, envSteps+"=40", envStepTime+"=20ms")
			cfg.MinWorkers, cfg.ReplaceLost = minimum, true
			cfg.ElasticTimeout, cfg.RemoveGrace, cfg.WakeAfter = tc.elastic, 500*time.Millisecond, tc.wake
			o, err := run(t, cfg)
			evs := r.all()
			if err != nil {
				t.Fatalf("job failed: %v\n%s", err, describe(evs))
			}
			var woken, stopped []int
			for _, e := range evs {
				n, ok := e.(job.Notice)
				if !ok {
					continue
				}
				var i int
				switch {
				case strings.Contains(n.Message, "out of the job's view for"):
					if _, err := fmt.Sscanf(n.Message, "worker %d", &i); err == nil {
						woken = append(woken, i)
					}
					if out := wokenAfter(t, n.Message); tc.wake > 0 && out >= tc.elastic/2 {
						t.Errorf("worker %d woken after %v out of view, want well under half of ElasticTimeout %v", i, out, tc.elastic)
					}
				case strings.Contains(n.Message, "stopping it as unresponsive"):
					if _, err := fmt.Sscanf(n.Message, "worker %d", &i); err == nil {
						stopped = append(stopped, i)
					}
				}
			}
			slices.Sort(woken) // workers out of view at once are woken in any order
			slices.Sort(stopped)
			if !slices.Equal(woken, tc.wantWoken) || !slices.Equal(stopped, tc.wantStopped) {
				t.Errorf("woken %v, stopped %v; want %v, %v\n%s", woken, stopped, tc.wantWoken, tc.wantStopped, describe(evs))
			}
			if len(o.Workers) != tc.wantWorkers {
				t.Fatalf("%d workers launched, want %d\n%s", len(o.Workers), tc.wantWorkers, describe(evs))
			}
			for _, w := range o.Workers {
				want, reason := job.Finished, job.NoStopReason
				switch {
				case slices.Contains(tc.wantStopped, w.Index):
					want, reason = job.Stopped, job.StopUnresponsive
				case strings.Split(tc.modes, ",")[w.Index] == "killmid":
					want = job.Lost
				}
				if w.State != want || w.StopReason != reason {
					t.Errorf("worker %d ended %v (%v), want %v (%v)", w.Index, w.State, w.StopReason, want, reason)
				}
			}
		})
	}
}

// wokenAfter reads how long a worker was out of view from the runner's
// notice that wakes it ("... out of the job's view for 1.5s (paused, ...").
func wokenAfter(t *testing.T, notice string) time.Duration {
	t.Helper()
	_, rest, _ := strings.Cut(notice, "out of the job's view for ")
	field, _, _ := strings.Cut(rest, " ")
	d, err := time.ParseDuration(field)
	if err != nil {
		t.Fatalf("no duration in the notice %q: %v", notice, err)
	}
	return d
}
