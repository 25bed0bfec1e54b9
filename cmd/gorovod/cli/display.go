package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job"
)

// display is everything `gorovod run` prints: the workers' lines, its own
// reports, the autoscaling decisions and summary, and a progress bar that
// steps aside whenever a line is printed.
type display struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
	bar            *progressbar.ProgressBar
	barMax         int64
}

func newDisplay(stdout, stderr io.Writer, mode string) *display {
	d := &display{stdout: stdout, stderr: stderr}
	show := mode == "always"
	if f, ok := stderr.(*os.File); ok && mode == "auto" {
		show = term.IsTerminal(int(f.Fd()))
	}
	if show {
		d.barMax = -1
		d.bar = progressbar.NewOptions64(-1,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("starting"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSpinnerType(14),
			progressbar.OptionClearOnFinish(),
		)
	}
	return d
}

// printLine writes one line, moving the progress bar out of its way.
func (d *display) printLine(w io.Writer, line string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bar != nil {
		_ = d.bar.Clear()
	}
	fmt.Fprintln(w, line)
}

// runSink prints a job's events as `gorovod run` shows them: the workers'
// lines prefixed by their launch index, the runner's reports on stderr, the
// autoscaling engine's events (as JSON lines on stdout with --json) and, at
// the end, the engine's summary and the workers' count.
type runSink struct {
	d                            *display
	asJSON, autoscaling, verbose bool
	// banner prints the rest of the job's first lines, after JobStarted's.
	banner func(job.JobStarted)
}

func (s runSink) Event(e job.Event) {
	d := s.d
	switch e := e.(type) {
	case job.WorkerOutput:
		d.workerLine(e.Worker, e.Stream, e.Line)
	case job.JobStarted:
		if e.Adopted {
			d.report("took back job %s: %d workers running, driver %s (pid %d)", e.JobID, e.Workers, e.DriverAddr, os.Getpid())
		} else {
			d.report("job %s, %d workers, driver %s (pid %d)", e.JobID, e.Workers, e.DriverAddr, os.Getpid())
		}
		if s.banner != nil {
			s.banner(e)
		}
	case job.WorkerStarted:
		if e.Worker.PID == 0 { // a launcher that does not know it (a Slurm step, a pod, a remote host)
			if e.Worker.Host != "" {
				d.report("worker %d on %s", e.Worker.Index, e.Worker.Host) // its pid is on that host, once it runs
			} else {
				d.report("worker %d started", e.Worker.Index)
			}
			return
		}
		if e.Adopted {
			d.report("worker %d pid %d (adopted)", e.Worker.Index, e.Worker.PID)
		} else if e.Initial {
			d.report("worker %d pid %d", e.Worker.Index, e.Worker.PID)
		} else {
			d.report("worker %d pid %d started", e.Worker.Index, e.Worker.PID)
		}
	case job.Notice:
		d.report("%s", e.Message)
	case job.WorkerExited:
		// A lost or failed worker is news at once, not only in the final count.
		switch e.State {
		case job.Lost:
			d.report("worker %d (pid %d) lost: %v; the job goes on without it", e.Worker.Index, e.Worker.PID, e.Err)
		case job.Failed:
			d.report("worker %d (pid %d) failed: %v", e.Worker.Index, e.Worker.PID, e.Err)
		case job.Unknown:
			d.report("worker %d (pid %d) exited without reporting the end of training: %v", e.Worker.Index, e.Worker.PID, e.Err)
		case job.Stopped:
			if s.verbose {
				d.report("worker %d (pid %d) stopped: %s", e.Worker.Index, e.Worker.PID, stopWhy(e.StopReason))
			}
		}
	case job.WorldChanged:
		for _, name := range e.ByHand {
			d.report("worker %s joined (started by hand): world %d has %d workers", name, e.World.Number, len(e.World.Members))
		}
	case job.Autoscaling:
		d.event(e.Event, s.asJSON, s.autoscaling || s.verbose)
	case job.JobEnded:
		o := e.Outcome
		d.summary(o.Summary, s.asJSON, s.autoscaling)
		d.report("%s", countLine(o))
		d.reportExclusions(o)
	}
}

// countLine is the job's last line: how its workers ended, those started by
// hand included (HandStartedWorker.Finished: one that did not finish had
// left before the end).
func countLine(o job.Outcome) string {
	if !o.TrainingFinished && o.LastStep == 0 && len(o.HandStarted) == 0 && o.Count(job.Finished) == o.Launched() {
		return fmt.Sprintf("%d workers exited with status 0 but none trained a step", o.Launched())
	}
	finished, byHand, left := o.Count(job.Finished), 0, 0
	for _, h := range o.HandStarted {
		if h.Finished {
			byHand++
		} else {
			left++
		}
	}
	line := fmt.Sprintf("%d workers finished", finished+byHand)
	if byHand > 0 {
		line += fmt.Sprintf(" (%d started by hand)", byHand)
	}
	line += fmt.Sprintf(", %d lost, %d failed", o.Count(job.Lost), o.Count(job.Failed))
	if n := o.Count(job.Unknown); n > 0 {
		line += fmt.Sprintf(", %d ended unknown (exit status not known: they ran under a runner that died)", n)
	}
	stopped := o.Count(job.Stopped)
	for _, why := range []job.StopReason{job.StopNotNeeded, job.StopStuck, job.StopHostDropped, job.StopStranded, job.StopUnresponsive} {
		if n := o.CountStopped(why); n > 0 {
			line += fmt.Sprintf(", %d stopped (%s)", n, stopWhy(why))
			stopped -= n
		}
	}
	if stopped > 0 { // stopped before this runner took the job back: its record does not say why
		line += fmt.Sprintf(", %d stopped (%s)", stopped, stopWhy(job.NoStopReason))
	}
	if left > 0 {
		line += fmt.Sprintf(", %d started by hand left before the end", left)
	}
	return line + fmt.Sprintf("; last world epoch %d had %d workers", o.World.Number, len(o.World.Members))
}

// stopWhy says why the runner stopped a worker, for a person.
func stopWhy(r job.StopReason) string {
	switch r {
	case job.StopNotNeeded:
		return "not needed any more"
	case job.StopStuck:
		return "removed as stuck"
	case job.StopHostDropped:
		return "host left the job"
	case job.StopStranded:
		return "the job could not go on: below its minimum for good"
	case job.StopUnresponsive:
		return "out of the job's view, paused or hung, and not back when woken"
	}
	return "before this runner took the job back, for a reason the job's record does not give"
}

func (d *display) workerLine(i int, stream string, line []byte) {
	w := d.stdout
	if stream == "stderr" {
		w = d.stderr
	}
	d.printLine(w, fmt.Sprintf("[%d] %s", i, line))
}

func (d *display) report(format string, args ...any) {
	d.printLine(d.stderr, "gorovod run: "+fmt.Sprintf(format, args...))
}

// event logs an engine event: a human line on stderr (world changes only
// when verbose), and with asJSON the event as a JSON line on stdout.
func (d *display) event(ev heuristics.Event, asJSON, human bool) {
	if asJSON {
		b, err := json.Marshal(ev)
		if err == nil {
			d.printLine(d.stdout, string(b))
		}
	}
	if human || ev.Kind != heuristics.EventWorld {
		d.report("%.1f s, step %d, %d workers: %s", ev.Elapsed, ev.Step, ev.Workers, ev.Message)
	}
}

// follow keeps the progress bar up to date until ctx ends.
func (d *display) follow(ctx context.Context, e interface{ Status() heuristics.Status }) {
	if d.bar == nil {
		return
	}
	every(ctx, 500*time.Millisecond, func() {
		st := e.Status()
		unit := "steps/s"
		if st.Samples {
			unit = "samples/s"
		}
		desc := fmt.Sprintf("%d workers, job %.0f %s", st.Workers, st.Throughput, unit)
		if st.Acting != "" {
			desc += " (" + st.Acting + ")"
		}
		d.mu.Lock()
		if d.bar == nil {
			d.mu.Unlock()
			return
		}
		if st.TotalSteps > 0 && st.TotalSteps != d.barMax {
			d.barMax = st.TotalSteps
			d.bar.ChangeMax64(st.TotalSteps)
		}
		d.bar.Describe(desc)
		_ = d.bar.Set64(st.Step)
		d.mu.Unlock()
	})
}

func (d *display) summary(s heuristics.Summary, asJSON, human bool) {
	d.close()
	if asJSON {
		b, err := json.Marshal(summaryLine(s))
		if err == nil {
			d.printLine(d.stdout, string(b))
		}
	}
	if human {
		d.mu.Lock()
		s.WriteText(d.stderr)
		d.mu.Unlock()
	}
}

func (d *display) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bar != nil {
		_ = d.bar.Finish()
		d.bar = nil
	}
}
