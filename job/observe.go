package job

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// What the runner shows of a running job besides its lifecycle: the
// workers' step statistics (StepsReported), the stall inspector's findings
// (Stalled) and the job's timeline (Config.Timeline).

// StepsReported: a worker sent its statistics of the steps it committed
// since its last report (every few steps, and at each world change), as the
// autoscaling engine receives them: for metrics, progress records, reports.
type StepsReported struct {
	At
	Worker string                  `json:"worker"` // its member name
	Steps  []heuristics.StepReport `json:"steps"`
}

// Stalled: some ranks of a world have waited in a collective past the stall
// check time (Config.StallCheck) for ranks that have not entered it. The
// runner also logs Message at WARN level.
type Stalled struct {
	At
	Stall stall.Stall `json:"stall"`
	// Missing names the member behind each missing rank (and its launch
	// index, when the runner launched it).
	Missing map[int]string `json:"missing"`
	Message string         `json:"message"`
}

// HandStartedWorker is a worker that joined the job without being launched
// by the runner (started by hand with the job file, or by another launcher).
type HandStartedWorker struct {
	Name string `json:"name"`
	// InLastWorld says it was a member of the job's last world.
	InLastWorld bool `json:"in_last_world"`
	// Finished says it finished training: it was in the last world of a
	// job that finished training, or it completed the last step and left
	// while others, whose last collective failed, redid that step without
	// it (so it is not in the last world).
	Finished bool `json:"finished"`
}

// stepReports converts a worker's statistics for the engine and the sinks.
func stepReports(worker string, steps []stats.Step, total int64) []heuristics.StepReport {
	reps := make([]heuristics.StepReport, len(steps))
	for i, s := range steps {
		reps[i] = heuristics.StepReport{Worker: worker, Epoch: s.Epoch, Step: s.Step, Samples: s.Samples,
			Compute: s.Compute, StepTime: s.StepTime, TotalSteps: total,
			Loss: s.Loss, HasLoss: s.HasLoss, Bytes: s.Bytes, Switch: s.Switch,
			Accum: s.Accum, GradSqr: s.GradSqr, GradVar: s.GradVar}
	}
	return reps
}

// stallWatch is the driver's half of the stall inspector: the newest
// snapshot of every worker, and the stalls already reported.
type stallWatch struct {
	threshold time.Duration

	mu       sync.Mutex
	snaps    map[string]stall.Snapshot
	worlds   []epoch.World           // the latest few, to name ranks
	reported map[[2]uint64]time.Time // (epoch, collective) → last report
}

// keptWorlds bounds the worlds (and snapshots) the watch keeps.
const keptWorlds = 8

func newStallWatch(threshold time.Duration) *stallWatch {
	if threshold == 0 {
		threshold = 60 * time.Second
	}
	return &stallWatch{threshold: threshold, snaps: map[string]stall.Snapshot{}, reported: map[[2]uint64]time.Time{}}
}

// world records a proposed world.
func (w *stallWatch) world(e epoch.World) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.worlds = append(w.worlds, e)
	if len(w.worlds) > keptWorlds {
		w.worlds = w.worlds[1:]
	}
	oldest := w.worlds[0].Number
	for name, s := range w.snaps {
		if s.Epoch < oldest {
			delete(w.snaps, name)
		}
	}
	for k := range w.reported {
		if k[0] < oldest {
			delete(w.reported, k)
		}
	}
}

// see takes worker's newest snapshot s and returns the stall to report, if
// it shows one: a collective stuck past the threshold (every rank's snapshot
// of that world says which ranks hold it up), reported once per threshold
// for each stuck collective; world is the world it is in (empty when the
// watch no longer keeps it).
func (w *stallWatch) see(worker string, s stall.Snapshot) (st stall.Stall, world epoch.World, ok bool) {
	if w.threshold < 0 {
		return stall.Stall{}, epoch.World{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.snaps[worker] = s
	if !s.InFlight || s.For < w.threshold {
		return stall.Stall{}, epoch.World{}, false
	}
	var snaps []stall.Snapshot
	for _, o := range w.snaps {
		if o.Epoch == s.Epoch {
			snaps = append(snaps, o)
		}
	}
	st, ok = stall.Find(s.Epoch, snaps, w.threshold)
	key := [2]uint64{st.Epoch, st.Seq}
	if !ok || time.Since(w.reported[key]) < w.threshold {
		return stall.Stall{}, epoch.World{}, false
	}
	w.reported[key] = time.Now()
	for _, e := range w.worlds {
		if e.Number == s.Epoch {
			world = e
		}
	}
	return st, world, true
}

// onStall is the driver's hook for a worker's snapshot (on its goroutine):
// a stall the watch finds is logged and reported, with the member (and
// process) behind each missing rank.
func (j *Job) onStall(worker string, s stall.Snapshot) {
	st, world, ok := j.stalls.see(worker, s)
	if !ok {
		return
	}
	ev := Stalled{At: now(), Stall: st, Missing: map[int]string{}}
	var who []string
	for _, r := range slices.Sorted(maps.Keys(st.Missing)) {
		if r >= len(world.Members) {
			continue
		}
		name := world.Members[r].Name
		desc := j.roster.describe(name)
		ev.Missing[r] = desc
		who = append(who, fmt.Sprintf("rank %d is %s", r, desc))
	}
	ev.Message = st.String()
	if len(who) > 0 {
		ev.Message += "; " + strings.Join(who, ", ")
	}
	j.cfg.Logger.Warn(ev.Message)
	j.events.later(ev)
}

// observabilityEnv is what the job's configuration asks of every worker's
// timeline and stall inspector, for its environment.
func (c Config) observabilityEnv() []string {
	return envconfig.Observability{Timeline: c.Timeline, StallCheck: c.StallCheck}.Environ()
}

// driverTimeline records the runner's own events in the driver's part of
// the job's timeline: worlds, workers started and ended, the engine's
// decisions, stalls, the end of training.
type driverTimeline struct{ tl *timeline.Timeline }

func (d driverTimeline) Event(e Event) {
	tl := d.tl
	switch e := e.(type) {
	case WorldChanged:
		tl.Instant(timeline.TrackElastic, fmt.Sprintf("world %d", e.World.Number), "elastic", e.Time,
			timeline.Int("size", int64(len(e.World.Members))), timeline.Str("joined", strings.Join(e.Joined, " ")),
			timeline.Str("left", strings.Join(e.Left, " ")))
		tl.Counter("world size", e.Time, float64(len(e.World.Members)))
		tl.SetProcessLabel(fmt.Sprintf("world %d, %d workers", e.World.Number, len(e.World.Members)))
	case WorkerStarted:
		tl.Instant(timeline.TrackElastic, fmt.Sprintf("worker %d started", e.Worker.Index), "workers", e.Time,
			timeline.Int("pid", int64(e.Worker.PID)), timeline.Str("host", e.Worker.Host))
	case WorkerExited:
		tl.Instant(timeline.TrackElastic, fmt.Sprintf("worker %d %s", e.Worker.Index, e.State), "workers", e.Time,
			timeline.Int("pid", int64(e.Worker.PID)), timeline.Str("name", e.Name), timeline.Str("error", errText(e.Err)))
	case Autoscaling:
		if e.Kind != heuristics.EventWorld {
			tl.Instant(timeline.TrackTraining, "autoscaling: "+e.Kind, "autoscaling", e.Time,
				timeline.Int("step", e.Step), timeline.Int("workers", int64(e.Workers)), timeline.Str("message", e.Message))
		}
	case Stalled:
		tl.Instant(timeline.TrackStalls, "stall", "stall", e.Time, timeline.Int("epoch", int64(e.Stall.Epoch)),
			timeline.Int("seq", int64(e.Stall.Seq)), timeline.Str("message", e.Message))
	case TrainingFinished:
		tl.Instant(timeline.TrackTraining, "training finished", "training", e.Time)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// jobTimeline is the job's timeline (Config.Timeline): the driver's own
// part, to which the runner's events go as the job runs (its sink), and at
// the end every process's part merged into the one file. A nil one is a job
// without a timeline.
type jobTimeline struct {
	base, jobID string
	tl          *timeline.Timeline // the driver's part
}

// openJobTimeline creates the driver's part of the job's timeline.
func openJobTimeline(base, jobID string) (*jobTimeline, error) {
	host, _ := os.Hostname()
	tl, err := timeline.Create(envconfig.TimelinePart(base, jobID, "driver"),
		timeline.Config{ProcessName: fmt.Sprintf("driver (%s, pid %d)", host, os.Getpid()), SortIndex: 0})
	if err != nil {
		return nil, fmt.Errorf("job: the timeline: %w", err)
	}
	return &jobTimeline{base: base, jobID: jobID, tl: tl}, nil
}

// sink records the runner's events in the driver's part.
func (t *jobTimeline) sink() Sink { return driverTimeline{t.tl} }

// merge closes the driver's part and merges every part of the job (the
// workers' included, cut off or not) into Config.Timeline, removing the
// parts once merged, and returns that file ("" when none was asked for or
// it could not be written). It says what it did with notice.
func (t *jobTimeline) merge(notice func(string)) string {
	if t == nil {
		return ""
	}
	base := t.base
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = t.tl.Close(ctx)
	cancel()
	parts, err := filepath.Glob(envconfig.TimelineParts(base, t.jobID))
	if err == nil && len(parts) == 0 {
		err = fmt.Errorf("no part of it was written (%s)", envconfig.TimelineParts(base, t.jobID))
	}
	var n int
	if err == nil {
		n, err = timeline.MergeFiles(base, parts...)
	}
	if err != nil {
		notice(fmt.Sprintf("the timeline could not be written to %s: %v", base, err))
		return ""
	}
	for _, p := range parts {
		os.Remove(p)
	}
	notice(fmt.Sprintf("timeline: %s (%d events from %d processes; chrome://tracing or ui.perfetto.dev)", base, n, len(parts)))
	return base
}
