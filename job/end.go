package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job/launch"
	"github.com/gorovod/gorovod/sync/epoch"
)

// The end of a job, all in this file:
//
//  1. Training is over once a member of the current world reports it (the
//     driver's Finished; sync's Worker.Finish sends the report).
//  2. The workers of the last world then exit by themselves. After
//     Config.FinishGrace, every process of the job still running is sent
//     SIGCONT: one paused (SIGSTOP) could neither finish nor exit, nor
//     write its last lines (the final world's rank 0 writes the job's
//     result after reporting the end). Then a process of the job that is a
//     member of the current world and has not reported the end is still
//     finishing the last step: a collective of that step completed for
//     some workers and failed for others, and the driver (sync/driver's
//     rescue) gave the others a world of their own to redo it in. The
//     runner waits for such workers, checking every FinishGrace/10, up to
//     Config.RescueLimit after training was reported over.
//  3. Any other process still running was waiting to join a job that is
//     over: the runner stops it (StopSignal and SIGCONT, then SIGKILL), and
//     however it exits, it counts as Stopped, not as a failure, with why in its record
//     (WorkerRecord.StopReason: StopNotNeeded here). Workers on a host the
//     Discovery dropped are stopped the same way (StopHostDropped), and so
//     is a worker the driver removed as stuck (Job.stopStuck, StopStuck;
//     SIGKILL after RemoveGrace), at once, and one out of the job's view
//     that a SIGCONT did not bring back (unresponsive.go,
//     StopUnresponsive): the floor replaces them like lost workers. So are
//     the running workers of a job the floor gives up on (StopStranded:
//     below its minimum after a worker failed, or after its replacements
//     struck out, no world can form again), and of a job whose first world
//     never formed (start.go: too few workers joined within
//     StartTimeout + ElasticTimeout). Members of the last world that
//     reported the end of training are exiting, not waiting: they are
//     stopped the same way only once Config.ExitLimit after training was
//     reported over has passed.
//  4. The job ends when every process it launched has exited; cancelling the
//     job's context stops them all first.
//  5. Each process's end is classified (classify): exit status 0 is Finished;
//     ended by a signal (kill -9, the OOM killer, stopped by the runner) or
//     lost with its host (a *launch.HostError: unreachable, or the connection to it
//     broke; the host is blacklisted) is Lost, which an elastic job survives;
//     stopped under rule 3 is Stopped; any other end is Failed.
//  6. A worker left out of a world while it was paused or cut off comes
//     back as a new member (sync's Worker.Rejoin: a new name, the same
//     launch index); the runner counts each exclusion and each return
//     (WorkerRecord.Excluded, Rejoined). One that exited with status 0
//     while left out, before training was over, is Excluded, not Finished;
//     one that exited by itself without ever being in a world, after
//     training was over (it was told it would never be admitted), is
//     Stopped.
//  7. The verdict (Outcome.Err): the job failed if no world ever formed
//     (Outcome.NoWorld, a *StartError), if a worker failed, if none
//     finished, if no step was trained (the workers exited without any of
//     them reporting a step or the end of training: a command that is not a
//     gorovod trainer, such as `true`), or if training did not finish —
//     never because a worker was lost, stopped or excluded on the way.
//  8. A runner that adopted a job (Config.Adopt) did not start its workers:
//     their exit statuses went to the runner that died. One that reported
//     the end of training and exited is Finished; any other is Unknown (it
//     may have been killed or have failed: nobody can tell), which, like
//     Lost, an elastic job survives — the verdict is then about what the
//     runner can know. The workers that ended before the adoption keep the
//     state the record gives them, and a stopped one the StopReason
//     (record.tsv's exited line).

// ErrFailed is wrapped by the error of a job that failed (Outcome.Err).
var ErrFailed = errors.New("job failed")

// WorkerState is where a worker process stands.
type WorkerState int

const (
	Running  WorkerState = iota // not exited yet
	Finished                    // exited with status 0
	Lost                        // ended by a signal: killed, frozen and killed, stopped
	Stopped                     // stopped by the runner: WorkerRecord.StopReason says why
	Failed                      // exited with an error of its own
	// Excluded: exited with status 0 after the job went on without it (left
	// out of a world while it was paused or cut off) and before training was
	// over, without coming back as a new member (rule 6).
	Excluded
	// Unknown: a worker of an adopted job (Config.Adopt) that exited without
	// reporting the end of training, or that was gone when the job was
	// adopted: its exit status went to the runner that died (rule 8).
	Unknown
)

func (s WorkerState) String() string {
	switch s {
	case Running:
		return "running"
	case Finished:
		return "finished"
	case Lost:
		return "lost"
	case Stopped:
		return "stopped"
	case Failed:
		return "failed"
	case Excluded:
		return "excluded"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("WorkerState(%d)", int(s))
}

// MarshalText names the state (JSON sinks).
func (s WorkerState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// StopReason is why the runner stopped a worker (rule 3; rule 6's worker
// that was never admitted): a person reading that a worker was stopped must
// not take a job that could not go on for one that had finished.
type StopReason int

const (
	// NoStopReason: not stopped, or stopped for a reason nobody knows (a
	// worker of an adopted job whose record gives it as stopped without a
	// reason: ReadJobRecord).
	NoStopReason StopReason = iota
	// StopNotNeeded: training was over and the worker was still waiting to
	// join, or still exiting at Config.ExitLimit (rule 3), or exited by
	// itself, never admitted (rule 6).
	StopNotNeeded
	// StopStuck: the driver removed it as stuck (Job.stopStuck).
	StopStuck
	// StopHostDropped: its host left the Discovery's list.
	StopHostDropped
	// StopStranded: the job was below its minimum with no way back (a
	// worker failed, replacements struck out, or too few workers joined
	// for a first world: Outcome.NoWorld) and ended, stopping it.
	StopStranded
	// StopUnresponsive: it ran out of the job's view (paused, hung, cut
	// off), was woken, and stayed out a quarter of Config.ElasticTimeout
	// after that (unresponsive.go). The last reason:
	// parseStopReason (the job's record) knows those up to it.
	StopUnresponsive
)

func (r StopReason) String() string {
	switch r {
	case NoStopReason:
		return ""
	case StopNotNeeded:
		return "not-needed"
	case StopStuck:
		return "stuck"
	case StopHostDropped:
		return "host-dropped"
	case StopStranded:
		return "stranded"
	case StopUnresponsive:
		return "unresponsive"
	}
	return fmt.Sprintf("StopReason(%d)", int(r))
}

// MarshalText names the reason (JSON sinks).
func (r StopReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// parseStopReason is the StopReason that String names, NoStopReason
// excepted (its name is ""): false for any other text.
func parseStopReason(name string) (StopReason, bool) {
	for r := StopNotNeeded; r <= StopUnresponsive; r++ {
		if r.String() == name {
			return r, true
		}
	}
	return NoStopReason, false
}

// classify is rule 5: how a process that has exited with err ended.
func classify(err error, stopped bool) WorkerState {
	switch {
	case err == nil:
		return Finished
	case stopped:
		return Stopped
	case errors.Is(err, ErrExitUnknown):
		return Unknown
	case KilledBySignal(err) || errors.As(err, new(*launch.HostError)):
		return Lost
	}
	return Failed
}

// WorkerError is a worker process that failed: Worker is its launch index,
// Err why it ended. It is package launch's, so that one type says it for
// the runner's verdict and for a set of workers launch.Start started.
type WorkerError = launch.WorkerError

// WorkerRecord is what the runner knows of a worker process it launched.
type WorkerRecord struct {
	WorkerRef
	// Name is its member name, once it joined the job ("" before, or when it
	// never did).
	Name  string      `json:"name,omitempty"`
	State WorkerState `json:"state"`
	// StopReason says why the runner stopped it, when State is Stopped.
	StopReason StopReason `json:"stop_reason,omitempty"`
	Err        error      `json:"-"` // why it ended, when not Finished
	Started    time.Time  `json:"started"`
	Exited     time.Time  `json:"exited"` // zero while running

	// Excluded counts the times a world left it out while it ran (declared
	// failed while paused or cut off), and Rejoined the times it came back
	// as a new member (rule 6).
	Excluded int `json:"excluded,omitempty"`
	Rejoined int `json:"rejoined,omitempty"`
}

// MarshalJSON encodes the record with its error as text ("error").
func (w WorkerRecord) MarshalJSON() ([]byte, error) {
	type plain WorkerRecord
	var msg string
	if w.Err != nil {
		msg = w.Err.Error()
	}
	return json.Marshal(struct {
		plain
		Err string `json:"error,omitempty"`
	}{plain(w), msg})
}

// Outcome is how a job ended.
type Outcome struct {
	JobID string `json:"job_id"`
	// TrainingFinished says a member of the last world reported that training
	// is over (rule 1).
	TrainingFinished bool `json:"training_finished"`
	// World is the last world the driver proposed.
	World epoch.World `json:"world"`
	// Workers holds the records of the worker processes the runner
	// launched, by launch index (hand-started workers are not among them):
	// every one, unless more than Config.KeepExitedWorkers exited, in which
	// case the records of those that exited first are left out and
	// EarlierWorkers counts them.
	Workers []WorkerRecord `json:"workers"`
	// EarlierWorkers counts, by how they ended, the launched workers whose
	// records are not in Workers (zero unless more than
	// Config.KeepExitedWorkers exited).
	EarlierWorkers WorkerCounts `json:"earlier_workers,omitzero"`
	// LastStep is the newest step any worker reported in its step statistics
	// (0 when none did: no step was trained, or the workers send none).
	LastStep int64 `json:"last_step"`
	// Summary is the autoscaling engine's account of the run.
	Summary heuristics.Summary `json:"summary"`
	// HandStarted are the workers that joined without being launched by the
	// runner (started by hand with the job file), in the order they joined.
	HandStarted []HandStartedWorker `json:"hand_started,omitempty"`
	// Timeline is the job's merged timeline file (Config.Timeline); "" when
	// none was asked for or it could not be written (a Notice says why).
	Timeline string `json:"timeline,omitempty"`
	// NoWorld says why the job gave up before its first world formed
	// (too few workers joined within StartTimeout + ElasticTimeout); nil
	// when it formed.
	NoWorld *StartError `json:"no_world,omitempty"`
}

// WorkerCounts counts worker processes by how they ended, the stopped ones
// by why too, and how many of them a world left out while they ran
// (WorkerRecord.Excluded > 0).
type WorkerCounts struct {
	Finished  int                `json:"finished,omitempty"`
	Lost      int                `json:"lost,omitempty"`
	Stopped   int                `json:"stopped,omitempty"`
	StoppedBy map[StopReason]int `json:"stopped_by,omitempty"` // Stopped by StopReason
	Failed    int                `json:"failed,omitempty"`
	Excluded  int                `json:"excluded,omitempty"`
	Unknown   int                `json:"unknown,omitempty"`
	LeftOut   int                `json:"left_out,omitempty"`
}

// add counts rec, a process that has exited.
func (c *WorkerCounts) add(rec WorkerRecord) {
	switch rec.State {
	case Finished:
		c.Finished++
	case Lost:
		c.Lost++
	case Stopped:
		c.addStopped(rec.StopReason, 1)
	case Failed:
		c.Failed++
	case Excluded:
		c.Excluded++
	default: // Unknown; a running process is never counted
		c.Unknown++
	}
	if rec.Excluded > 0 {
		c.LeftOut++
	}
}

// addStopped counts n more stopped for reason.
func (c *WorkerCounts) addStopped(reason StopReason, n int) {
	if n == 0 {
		return
	}
	c.Stopped += n
	if c.StoppedBy == nil {
		c.StoppedBy = map[StopReason]int{}
	}
	c.StoppedBy[reason] += n
}

// Of is how many ended in state s.
func (c WorkerCounts) Of(s WorkerState) int {
	switch s {
	case Finished:
		return c.Finished
	case Lost:
		return c.Lost
	case Stopped:
		return c.Stopped
	case Failed:
		return c.Failed
	case Excluded:
		return c.Excluded
	case Unknown:
		return c.Unknown
	}
	return 0
}

// Total is how many it counts.
func (c WorkerCounts) Total() int {
	return c.Finished + c.Lost + c.Stopped + c.Failed + c.Excluded + c.Unknown
}

// Count is how many workers the runner launched ended in state s, those
// counted in EarlierWorkers included.
func (o *Outcome) Count(s WorkerState) int {
	n := o.EarlierWorkers.Of(s)
	for _, w := range o.Workers {
		if w.State == s {
			n++
		}
	}
	return n
}

// CountStopped is how many workers the runner launched it stopped for
// reason, those counted in EarlierWorkers included.
func (o *Outcome) CountStopped(reason StopReason) int {
	n := o.EarlierWorkers.StoppedBy[reason]
	for _, w := range o.Workers {
		if w.State == Stopped && w.StopReason == reason {
			n++
		}
	}
	return n
}

// Launched is how many worker processes the runner launched: the records
// in Workers and those counted in EarlierWorkers.
func (o *Outcome) Launched() int { return len(o.Workers) + o.EarlierWorkers.Total() }

// Err is the job's verdict (rule 7): nil when training finished, some worker
// finished and none failed; otherwise an error wrapping ErrFailed (and every
// failed worker's *WorkerError, for those whose records are kept).
func (o *Outcome) Err() error {
	if o.NoWorld != nil {
		return fmt.Errorf("%w: %w", ErrFailed, o.NoWorld)
	}
	var failed []error
	for _, w := range o.Workers {
		if w.State == Failed {
			failed = append(failed, &WorkerError{Worker: w.Index, Err: w.Err})
		}
	}
	if n := o.EarlierWorkers.Failed; n > 0 {
		failed = append(failed, fmt.Errorf("%d more failed workers (their records are not kept: Config.KeepExitedWorkers)", n))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w: %w", ErrFailed, errors.Join(failed...))
	}
	if o.Count(Finished) == 0 {
		return fmt.Errorf("%w: no worker finished", ErrFailed)
	}
	if !o.TrainingFinished && o.LastStep == 0 {
		return fmt.Errorf("%w: %d workers exited without training a step (none joined a world and reported a step or the end of training): is the command a gorovod trainer?",
			ErrFailed, o.Count(Finished))
	}
	if !o.TrainingFinished {
		return fmt.Errorf("%w: training did not finish (no member of the last world reported its end)", ErrFailed)
	}
	return nil
}

// ending carries out rules 1 to 3 once training is reported over: it
// notes the report, waits for workers still finishing the last step, and
// stops the processes the job no longer needs. It owns the clock of the
// end: when training was reported over and the two deadlines after it
// (rule 2's next look, rule 3's ExitLimit), which Job.supervise waits on;
// those fields are touched on supervise's goroutine only, so they take no
// lock.
type ending struct {
	cfg     Config // FinishGrace, RescueLimit, ExitLimit
	driver  Driver
	roster  *roster
	events  *eventStream
	stopAll context.CancelFunc // stops every process of the job at once

	finishedAt time.Time        // training was reported over (zero: not yet)
	woken      bool             // rule 2's first look has woken the running processes
	late       <-chan time.Time // look again for workers finishing the last step (rule 2)
	exiting    <-chan time.Time // ExitLimit: stop the members still exiting (rule 3)
}

// trainingFinished is rule 1: a member reported the end of training.
func (e *ending) trainingFinished() {
	e.roster.setTrainingOver()
	e.events.emit(TrainingFinished{At: now()})
}

// reported is rule 1 as supervise sees it: training was reported over now,
// and rule 2's wait for the workers finishing the last step starts.
func (e *ending) reported() {
	e.finishedAt = time.Now()
	e.trainingFinished()
	e.late = time.After(e.cfg.FinishGrace)
}

// lookLate is rule 2's look, FinishGrace after the report and every
// FinishGrace/10 after that while a member still finishes the last step
// (up to RescueLimit); then rule 3 stops the late joiners, and the members
// that are exiting get until ExitLimit.
func (e *ending) lookLate() {
	if !e.woken {
		e.woken = true
		e.wakeRunning()
	}
	if time.Since(e.finishedAt) < e.cfg.RescueLimit && e.finishingLastStep() {
		e.late = time.After(e.cfg.FinishGrace / 10)
		return
	}
	e.late = nil
	if e.stopLateJoiners(StopNotNeeded, true) {
		e.exiting = time.After(time.Until(e.finishedAt.Add(e.cfg.ExitLimit)))
	}
}

// wakeRunning is rule 2's first step: every process of the job still
// running gets SIGCONT. One paused (SIGSTOP) can neither finish its last
// step nor exit, and the final world's rank 0 paused between its report of
// the end and its final line would be stopped at ExitLimit with that line,
// the job's result, never written. A running one ignores the signal.
func (e *ending) wakeRunning() {
	for _, p := range e.roster.running() {
		_ = p.Signal(syscall.SIGCONT)
	}
}

// exitLimit is rule 3 at ExitLimit: whatever still runs is stopped.
func (e *ending) exitLimit() {
	e.exiting = nil
	e.stopLateJoiners(StopNotNeeded, false)
}

// lateReportWait bounds how long a job whose processes have all exited
// still waits for a report that training is over (rule 1) before its
// verdict. A worker sends the report and exits: when the driver is slow (a
// loaded host, a -race build) or was frozen for a moment, it can see the
// process exit before it has read the report, which is already in its
// socket buffers, and would fail the job for "training did not finish".
const lateReportWait = 2 * time.Second

// awaitLateReport waits, at most lateReportWait, for the driver to take a
// report of the end of training that may still be in flight once every
// process has exited; finishedAt is set when it comes.
func (e *ending) awaitLateReport(finished <-chan struct{}) {
	t := time.NewTimer(lateReportWait)
	defer t.Stop()
	select {
	case <-finished:
		e.trainingFinished()
		e.finishedAt = time.Now()
	case <-t.C:
	}
}

// finishingLastStep is rule 2: whether a member of the current world that has
// not reported the end of training is a running process of this job.
func (e *ending) finishingLastStep() bool {
	unfinished := e.driver.Unfinished()
	if len(unfinished) == 0 {
		return false
	}
	e.roster.learn(e.driver.Workers())
	return e.roster.anyRunning(unfinished)
}

// stopLateJoiners is rule 3 at the end of training (and the floor's end of
// a job stranded below its minimum): every process still running is
// stopped and will count as Stopped for why — except, when spareExiting,
// the members of the current world that reported the end of training, which
// are left to exit by themselves; the others then get StopSignal one by one
// (a later call without spareExiting ends them all). It reports whether it
// spared any.
func (e *ending) stopLateJoiners(why StopReason, spareExiting bool) (spared bool) {
	r := e.roster
	exiting := map[*proc]bool{}
	if spareExiting {
		unfinished := e.driver.Unfinished()
		r.learn(e.driver.Workers())
		r.mu.Lock()
		for _, m := range e.driver.Current().Members {
			if p := r.byName[m.Name]; p != nil && p.rec.State == Running && !slices.Contains(unfinished, m.Name) {
				exiting[p] = true
			}
		}
		r.mu.Unlock()
	}
	var stop []Process
	r.mu.Lock()
	for _, p := range r.procs {
		if p.rec.State == Running && !exiting[p] {
			p.stop(why)
			stop = append(stop, p.p)
		}
	}
	r.mu.Unlock()
	if len(exiting) == 0 {
		e.stopAll()
		return false
	}
	for _, p := range stop {
		_ = launch.SignalAwake(p, StopSignal)
	}
	return true
}
