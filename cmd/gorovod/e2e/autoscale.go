package e2e

import (
	"testing"

	"github.com/gorovod/gorovod/heuristics"
)

// EngineEvent is one of the engine's --json lines.
type EngineEvent struct {
	heuristics.Event
	Summary heuristics.Summary // of the last line, event "summary"
}

// LogDecisions logs a job's heuristic decisions (from its --json events) and
// the throughput per world size its summary measured.
func LogDecisions(t *testing.T, evs []EngineEvent) {
	t.Helper()
	for _, ev := range evs {
		if ev.Kind != "summary" && ev.Kind != heuristics.EventWorld {
			t.Logf("%6.1f s step %4d %d workers %-9s %s", ev.Elapsed, ev.Step, ev.Workers, ev.Kind, ev.Message)
		}
	}
	s := evs[len(evs)-1].Summary
	for _, m := range s.Throughput {
		t.Logf("measured: %d workers %.0f samples/s (step %.2f ms, %d steps)", m.Workers, m.Throughput, float64(m.StepTime)/1e6, m.Steps)
	}
}
