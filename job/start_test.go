package job_test

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
)

// logLine is a line of the driver's log, recorded among the events.
type logLine struct {
	job.At
	Line string
}

// logTo records the driver's log lines (Info and above) in r.
func logTo(r *recorder) *slog.Logger {
	return slog.New(slog.NewTextHandler(lineWriter(func(b []byte) {
		r.Event(logLine{At: job.At{Time: time.Now()}, Line: strings.TrimSpace(string(b))})
	}), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type lineWriter func([]byte)

func (w lineWriter) Write(b []byte) (int, error) { w(b); return len(b), nil }

// A job of 3 workers with a floor of 2 starts with 3, as Horovod starts a
// job with -np workers: its first world waits for the third worker however
// late it comes within the start timeout. Only when it does not come in
// time, or exits before it joins, does the first world form with fewer
// (never below the floor), and the job says so in a warning.
func TestFirstWorldWaitsForAllWorkers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		workers, min int    // default 3 and 2
		modes        string // per launch index
		startTimeout time.Duration
		wantFirst    int           // members of the first world
		wantWarning  string        // in a notice, "" for none
		atLeast      time.Duration // from the job's start to its first world
		atMost       time.Duration
	}{
		{name: "the third comes late", modes: "train,train,late", startTimeout: time.Minute, wantFirst: 3, atMost: time.Minute},
		{name: "the third never comes", modes: "train,train,wait", startTimeout: 3 * time.Second, wantFirst: 2,
			wantWarning: "started with 2 of its 3 workers: the others did not join within the start timeout (3s)", atLeast: 3 * time.Second, atMost: time.Minute},
		{name: "the third exits before it joins", modes: "train,train,kill", startTimeout: time.Minute, wantFirst: 2,
			wantWarning: "started with 2 of its 3 workers: the others exited before they joined", atMost: 50 * time.Second},
		// One of four joins and two exit before they join: the first
		// world's voters are the two not known gone, of which the driver
		// holds half, so at the start timeout it forms with one (the
		// fourth may be alive behind a partition; with all three still
		// running, the driver would wait for a second one).
		{name: "one of four joins, two exit, one never comes", workers: 4, min: 1, modes: "train,kill,kill,wait", startTimeout: 3 * time.Second, wantFirst: 1,
			wantWarning: "started with 1 of its 4 workers: the others did not join within the start timeout (3s)", atLeast: 3 * time.Second, atMost: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			gate := filepath.Join(t.TempDir(), "gate")
			if err := syscall.Mkfifo(gate, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := config(t, r, cmp.Or(tc.workers, 3), envModes+"="+tc.modes, envGate+"="+gate, envSteps+"=20", envStepTime+"=20ms")
			cfg.MinWorkers, cfg.StartTimeout, cfg.FinishGrace = cmp.Or(tc.min, 2), tc.startTimeout, time.Second
			cfg.Logger = logTo(r)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			j, err := job.Start(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(tc.modes, "late") {
				// The first two have joined and the driver waits for the
				// third (or, wrongly, a world has formed without it).
				r.waitFor(t, "the driver waiting with 2 workers", func(evs []job.Event) bool {
					return slices.ContainsFunc(evs, func(e job.Event) bool {
						l, ok := e.(logLine)
						_, world := e.(job.WorldChanged)
						return world || ok && strings.Contains(l.Line, "waiting for enough workers") && strings.Contains(l.Line, "have=2")
					})
				})
				go func() { // let the third worker start
					if f, err := os.OpenFile(gate, os.O_WRONLY, 0); err == nil {
						f.Close()
					}
				}()
			}
			o, err := j.Wait()
			evs := r.all()
			if err != nil {
				t.Fatalf("job failed: %v\n%s", err, describe(evs))
			}
			var started, first time.Time
			var firstSize int
			var warnings []string
			for _, e := range evs {
				switch e := e.(type) {
				case job.JobStarted:
					started = e.Time
				case job.WorldChanged:
					if first.IsZero() {
						first, firstSize = e.Time, len(e.World.Members)
					}
				case job.Notice:
					if strings.HasPrefix(e.Message, "warning: the job started with") {
						warnings = append(warnings, e.Message)
					}
				}
			}
			if firstSize != tc.wantFirst {
				t.Fatalf("the first world has %d members, want %d\n%s", firstSize, tc.wantFirst, describe(evs))
			}
			if wait := first.Sub(started); wait < tc.atLeast || wait > tc.atMost {
				t.Errorf("the first world formed %v after the start, want within [%v, %v]", wait, tc.atLeast, tc.atMost)
			}
			switch {
			case tc.wantWarning == "" && len(warnings) > 0:
				t.Errorf("warnings %q, want none", warnings)
			case tc.wantWarning != "" && (len(warnings) != 1 || !strings.Contains(warnings[0], tc.wantWarning)):
				t.Errorf("warnings %q, want one with %q", warnings, tc.wantWarning)
			}
			if !o.TrainingFinished {
				t.Errorf("training did not finish: %+v", o)
			}
		})
	}
}

// A job whose first world cannot form, because too few of its workers ever
// join (paused before they reached the job, or hung), warns at the start
// timeout naming those that have not joined, and fails ElasticTimeout later
// with a *job.StartError naming them, its running workers stopped (paused
// ones woken to take the stop signal) — rather than waiting without end.
func TestJobWithoutAFirstWorldGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name          string
		workers, min  int
		modes         string
		wantJoined    int
		wantNeeded    int
		wantNotJoined []int // launch indexes
	}{
		{name: "every worker paused", workers: 2, min: 1, modes: "pause", wantNeeded: 1, wantNotJoined: []int{0, 1}},
		{name: "every worker hung", workers: 2, min: 1, modes: "deaf", wantNeeded: 1, wantNotJoined: []int{0, 1}},
		// One joins: a world needs two (the minimum, and half of the
		// three voters).
		{name: "one of three joins", workers: 3, min: 2, modes: "train,pause,wait", wantJoined: 1, wantNeeded: 2, wantNotJoined: []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder()
			cfg := config(t, r, tc.workers, envModes+"="+tc.modes)
			cfg.MinWorkers, cfg.StartTimeout, cfg.ElasticTimeout = tc.min, 2*time.Second, 2*time.Second
			cfg.RemoveGrace = time.Second
			o, err := run(t, cfg)
			evs := r.all()
			var se *job.StartError
			if !errors.As(err, &se) || !errors.Is(err, job.ErrFailed) {
				t.Fatalf("job ended with %v, want a *job.StartError wrapped in job.ErrFailed\n%s", err, describe(evs))
			}
			var notJoined []int
			for _, w := range se.NotJoined {
				notJoined = append(notJoined, w.Index)
			}
			if se.Joined != tc.wantJoined || se.Needed != tc.wantNeeded || !slices.Equal(notJoined, tc.wantNotJoined) {
				t.Errorf("StartError %+v: joined %d, needed %d, not joined %v; want %d, %d, %v",
					se, se.Joined, se.Needed, notJoined, tc.wantJoined, tc.wantNeeded, tc.wantNotJoined)
			}
			if se.Waited < cfg.StartTimeout+cfg.ElasticTimeout {
				t.Errorf("gave up %v after the launch, before StartTimeout + ElasticTimeout", se.Waited)
			}
			if o.NoWorld != se {
				t.Errorf("Outcome.NoWorld %v, want the error's %v", o.NoWorld, se)
			}
			// The warning at the start timeout names the same workers.
			var warning string
			for _, e := range evs {
				if n, ok := e.(job.Notice); ok && strings.HasPrefix(n.Message, "warning: no world formed") {
					warning = n.Message
				}
			}
			for _, w := range se.NotJoined {
				if !strings.Contains(warning, w.String()) || !strings.Contains(err.Error(), w.String()) {
					t.Errorf("%v is not named in the warning %q or the error %q", w, warning, err)
				}
			}
			for _, w := range o.Workers {
				if w.State != job.Stopped || w.StopReason != job.StopStranded {
					t.Errorf("worker %d ended %v (%v), want stopped (stranded)", w.Index, w.State, w.StopReason)
				}
			}
		})
	}
}
