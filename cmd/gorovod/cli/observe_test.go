package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/job"
)

// With --json, `gorovod run` ends its stdout with the summary: the ticker's
// progress records stop at the job's end, although the launcher runs on for
// a while after it (CI: TestAutoscaleScalingEfficiencyFindsTarget found a
// progress record after the summary). Rows: with and without --report's
// run.jsonl, which also has the job's end write a last progress record.
func TestNoProgressRecordAfterTheSummary(t *testing.T) {
	for _, report := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "json and report"}[report], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			d := newDisplay(&stdout, &stderr, "never")
			o := &obsOptions{}
			if report {
				o.reportDir = t.TempDir()
			}
			w, err := startWatchers(t.Context(), o, d, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer w.stop()
			sinks := []job.Sink{w, runSink{d: d, asJSON: true, autoscaling: true}}
			emit := func(e job.Event) {
				for _, s := range sinks {
					s.Event(e)
				}
			}
			start := time.Now()
			emit(job.Autoscaling{Event: heuristics.Event{Kind: heuristics.EventWorld, Time: start, Workers: 2}})
			st := heuristics.Status{Workers: 2, Step: 10}
			w.tick(st)
			if !strings.Contains(stdout.String(), `{"event":"progress"`) {
				t.Fatalf("no progress record before the end:\n%s", stdout.String())
			}
			emit(job.JobEnded{})
			w.tick(st) // a tick after the end, as the launcher shuts down
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if last := lines[len(lines)-1]; !strings.HasPrefix(last, `{"event":"summary"`) {
				t.Errorf("stdout's last line is %q, not the summary; stdout:\n%s", last, stdout.String())
			}
		})
	}
}
