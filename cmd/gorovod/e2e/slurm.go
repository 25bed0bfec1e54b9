package e2e

import (
	"encoding/json"
	"testing"

	"github.com/gorovod/gorovod/heuristics"
)

// engineEvents decodes the engine's JSON lines seen so far (under h.mu).
func (h *RunJobHarness) EngineEventsLocked(t *testing.T) []EngineEvent {
	t.Helper()
	var evs []EngineEvent
	for _, line := range h.Events {
		var ev EngineEvent
		err := json.Unmarshal([]byte(line), &ev.Event)
		if err == nil && ev.Kind == "summary" {
			err = json.Unmarshal([]byte(line), &ev.Summary)
		}
		if err != nil {
			t.Fatalf("bad engine line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// CarriedOut says whether a decision to grow (or shrink) took effect.
func CarriedOut(evs []EngineEvent, action heuristics.Action) bool {
	for _, ev := range evs {
		if ev.Kind == heuristics.EventDone && ev.Decision != nil && ev.Decision.Action == action {
			return true
		}
	}
	return false
}
