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
}

func (s runSink) Event(e job.Event) {
	d := s.d
	switch e := e.(type) {
	case job.WorkerOutput:
		d.workerLine(e.Worker, e.Stream, e.Line)
	case job.JobStarted:
		d.report("job %s, %d workers, driver %s (pid %d)", e.JobID, e.Workers, e.DriverAddr, os.Getpid())
	case job.WorkerStarted:
		if e.Worker.Host != "" && e.Worker.PID == 0 {
			d.report("worker %d on %s", e.Worker.Index, e.Worker.Host) // its pid is on that host, once it runs
			return
		}
		if e.Initial {
			d.report("worker %d pid %d", e.Worker.Index, e.Worker.PID)
		} else {
			d.report("worker %d pid %d started", e.Worker.Index, e.Worker.PID)
		}
	case job.Notice:
		d.report("%s", e.Message)
	case job.Autoscaling:
		d.event(e.Event, s.asJSON, s.autoscaling || s.verbose)
	case job.JobEnded:
		o := e.Outcome
		d.summary(o.Summary, s.asJSON, s.autoscaling)
		d.report("%d workers finished, %d lost, %d failed; last world epoch %d had %d workers",
			o.Count(job.Finished), o.Count(job.Lost)+o.Count(job.Stopped), o.Count(job.Failed), o.World.Number, len(o.World.Members))
		d.reportExclusions(o)
	}
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
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := e.Status()
		unit := "steps/s"
		if st.Samples {
			unit = "samples/s"
		}
		desc := fmt.Sprintf("%d workers, %.0f %s", st.Workers, st.Throughput, unit)
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
	}
}

func (d *display) summary(s heuristics.Summary, asJSON, human bool) {
	d.close()
	if asJSON {
		b, err := json.Marshal(struct {
			Event string `json:"event"`
			heuristics.Summary
		}{"summary", s})
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
