package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/internal/logging"
	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/observe/metrics"
	"github.com/gorovod/gorovod/observe/report"
)

// obsOptions are `gorovod run`'s flags for watching a job: its logging,
// timeline, metrics endpoint, stall inspector and run report.
type obsOptions struct {
	log         logging.Options
	verbose     bool // -v: --log-level info, and the engine's world events
	timeline    string
	metricsAddr string
	reportDir   string
	stallCheck  string
}

func (o *obsOptions) register(fs *flag.FlagSet) {
	o.log.Register(fs)
	fs.BoolVar(&o.verbose, "v", false, "log the driver's decisions (--log-level info) and every world change")
	fs.BoolVar(&o.verbose, "verbose", false, "horovodrun's name for -v")
	fs.StringVar(&o.timeline, "timeline-filename", "", "write the job's Chrome trace (chrome://tracing, ui.perfetto.dev) to this `file`: every worker's collectives and their phases, steps, world switches, state broadcasts and stalls")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics of the job at http://`host:port`/metrics (port 0 picks one). The endpoint is unauthenticated, and a host-less :9100 binds every interface: use 127.0.0.1:9100 unless scrapers on other hosts must reach it")
	fs.StringVar(&o.reportDir, "report", "", "write the run's report into this `directory` at the end: run.jsonl, plots (SVG, PNG) and index.html")
	fs.StringVar(&o.stallCheck, "stall-check-time", "60s", "warn, naming the missing ranks, when a collective waits this long for ranks that have not entered it; 0 turns the check off")
}

// check validates the flags (before anything starts) and returns the stall
// check time for job.Config (negative: off).
func (o *obsOptions) check() (time.Duration, error) {
	if o.verbose && o.log.Level == logging.DefaultOptions().Level {
		o.log.Level = "info"
	}
	if err := o.log.Validate(); err != nil {
		return 0, err
	}
	d, err := envconfig.ParseStallCheck(o.stallCheck)
	if err != nil {
		return 0, fmt.Errorf("--stall-check-time: %w", err)
	}
	if o.timeline != "" {
		if fi, err := os.Stat(o.timeline); err == nil && fi.IsDir() {
			return 0, fmt.Errorf("--timeline-filename %s is a directory", o.timeline)
		}
		if dir := filepath.Dir(o.timeline); dir != "" {
			if _, err := os.Stat(dir); err != nil {
				return 0, fmt.Errorf("--timeline-filename: %w", err)
			}
		}
	}
	if d == 0 {
		d = -1
	}
	return d, nil
}

// workerEnv is what the workers' library logging gets: the same level and
// format as the driver's.
func (o *obsOptions) workerEnv() []string {
	return envconfig.Observability{LogLevel: o.log.Level, LogFormat: o.log.Format}.Environ()
}

// watchers is what `gorovod run` keeps of a job besides its display: the
// periodic progress records (--json, --report), the metrics (--metrics-addr)
// and the run's JSON lines for its report (--report).
type watchers struct {
	o       *obsOptions
	d       *display
	asJSON  bool
	window  progressWindow
	metrics *metrics.Job
	server  *metrics.Server

	// tickMu orders the periodic progress records before the summary:
	// once the job ended (ended, set under it) the ticker writes none, and
	// a record it is writing is out before the job's end is handled. With
	// --json the summary is the last line on stdout, and the launcher can
	// run on for a tick after it (stopping the workers, closing the driver).
	tickMu sync.Mutex
	ended  bool

	mu      sync.Mutex
	runFile *os.File // DIR/run.jsonl
	run     *bufio.Writer
	jobID   string
	status  func() heuristics.Status // the job's, once started
}

// attach gives the watchers the running job.
func (w *watchers) attach(j *job.Job) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.status = j.Status
}

// startWatchers starts the metrics server and creates the report's
// directory, so that a mistake in either fails before the job starts.
func startWatchers(ctx context.Context, o *obsOptions, d *display, asJSON bool, log *slog.Logger) (*watchers, error) {
	w := &watchers{o: o, d: d, asJSON: asJSON}
	if o.metricsAddr != "" {
		w.metrics = metrics.NewJob()
		var err error
		if w.server, err = metrics.Serve(ctx, w.metrics.Registry(), metrics.ServerConfig{Addr: o.metricsAddr, Logger: log}); err != nil {
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	if o.reportDir != "" {
		if err := os.MkdirAll(o.reportDir, 0o755); err != nil {
			w.stop()
			return nil, fmt.Errorf("--report: %w", err)
		}
		f, err := os.Create(filepath.Join(o.reportDir, "run.jsonl"))
		if err != nil {
			w.stop()
			return nil, fmt.Errorf("--report: %w", err)
		}
		w.runFile, w.run = f, bufio.NewWriter(f)
	}
	return w, nil
}

// announce says where the metrics are served.
func (w *watchers) announce() {
	if w.server != nil {
		w.d.report("metrics at http://%s/metrics", w.server.Addr())
	}
}

// needed says whether any watcher is on (otherwise the job needs no sink
// and no ticker for them).
func (w *watchers) needed() bool {
	return w.asJSON || w.metrics != nil || w.run != nil
}

// Event is the watchers' job.Sink.
func (w *watchers) Event(e job.Event) {
	w.window.event(e)
	if m := w.metrics; m != nil {
		switch e := e.(type) {
		case job.StepsReported:
			m.ObserveSteps(e.Steps)
		case job.WorldChanged:
			m.World(e.World.Number, len(e.World.Members), 0)
		case job.Autoscaling:
			m.Event(e.Event)
		case job.Stalled:
			m.Stall()
		case job.WorkerExited:
			switch e.State {
			case job.Lost:
				m.Failure(metrics.FailureWorkerLost)
			case job.Failed:
				m.Failure(metrics.FailureWorkerExited)
			}
		}
	}
	if _, ok := e.(job.JobEnded); ok {
		w.tickMu.Lock()
		w.ended = true
		w.tickMu.Unlock()
	}
	if w.run == nil {
		return
	}
	switch e := e.(type) {
	case job.JobStarted:
		w.mu.Lock()
		w.jobID = e.JobID
		w.mu.Unlock()
	case job.Autoscaling:
		w.writeRun(e.Event)
	case job.WorkerOutput:
		if e.Stream == "stdout" && len(e.Line) > 0 && e.Line[0] == '{' {
			w.mu.Lock()
			fmt.Fprintf(w.run, "[%d] %s\n", e.Worker, e.Line)
			w.mu.Unlock()
		}
	case job.JobEnded:
		w.mu.Lock()
		status := w.status
		w.mu.Unlock()
		if status != nil {
			w.progress(status()) // the last steps
		}
		w.writeRun(summaryLine(e.Outcome.Summary))
	}
}

// writeRun adds one JSON line to run.jsonl.
func (w *watchers) writeRun(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.run.Write(b)
	w.run.WriteByte('\n')
}

// progressLine is a progress record as `gorovod run` writes it.
type progressLine struct {
	Event string `json:"event"`
	report.Progress
}

// summaryLine is the engine's summary as `gorovod run --json` ends with it.
func summaryLine(s heuristics.Summary) any {
	return struct {
		Event string `json:"event"`
		heuristics.Summary
	}{"summary", s}
}

// follow writes a progress record every progressEvery and keeps the
// metrics' view of the engine current, until ctx ends (the job's end
// writes the last record).
func (w *watchers) follow(ctx context.Context, j *job.Job) {
	every(ctx, progressEvery, func() { w.tick(j.Status()) })
}

// tick writes a periodic progress record, unless the job has ended (its
// last record and the summary are written then).
func (w *watchers) tick(st heuristics.Status) {
	w.tickMu.Lock()
	defer w.tickMu.Unlock()
	if !w.ended {
		w.progress(st)
	}
}

// every calls f every period until ctx ends.
func every(ctx context.Context, period time.Duration, f func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			f()
		}
	}
}

// progress writes one progress record.
func (w *watchers) progress(st heuristics.Status) {
	if w.metrics != nil {
		w.metrics.Status(st)
	}
	rec, ok := w.window.record(time.Now(), st)
	if !ok {
		return
	}
	line := progressLine{"progress", rec}
	if w.asJSON {
		if b, err := json.Marshal(line); err == nil {
			w.d.printLine(w.d.stdout, string(b))
		}
	}
	if w.run != nil {
		w.writeRun(line)
	}
}

// finish writes the report of the job (--report) and stops the metrics
// server. The report's failure is the command's, unless the job failed.
func (w *watchers) finish(o job.Outcome) error {
	defer w.stop()
	if w.run == nil {
		return nil
	}
	w.mu.Lock()
	err := w.run.Flush()
	w.run = nil
	jobID := w.jobID
	w.mu.Unlock()
	if cerr := w.runFile.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	path := w.runFile.Name()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	run, err := report.Read(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("--report: reading %s: %w", path, err)
	}
	if len(run.Events) == 0 && len(run.Progress) == 0 {
		w.d.report("no report in %s: the job formed no world (its JSON lines are in %s)", w.o.reportDir, path)
		return nil
	}
	title := "gorovod run report"
	if jobID != "" {
		title += ": " + jobID
	}
	files, err := report.Write(w.o.reportDir, run, report.Options{Title: title, Source: path})
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	w.d.report("report: %s (%d files)", files[0], len(files))
	return nil
}

// stop stops the metrics server.
func (w *watchers) stop() {
	if w.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = w.server.Close(ctx)
		w.server = nil
	}
	if w.runFile != nil && w.run != nil {
		w.runFile.Close()
	}
}
