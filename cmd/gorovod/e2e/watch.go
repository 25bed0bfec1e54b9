package e2e

import (
	"regexp"
	"testing"
	"time"
)

// WaitLog waits until the launcher's log (its own lines and the workers'
// non-JSON lines) matches re, and returns the match.
func (h *RunJobHarness) WaitLog(t *testing.T, what string, timeout time.Duration, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if m := re.FindStringSubmatch(h.LogText()); m != nil {
			return m
		}
		select {
		case <-h.Notify:
		case err := <-h.Exited:
			h.Exited <- err
			if m := re.FindStringSubmatch(h.LogText()); m != nil {
				return m
			}
			t.Fatalf("the job ended (%v) before %s; launcher log:\n%s", err, what, h.LogText())
		case <-deadline:
			h.TimedOut(t, what)
		}
	}
}

// Wait waits for the job's end; it must succeed.
func (h *RunJobHarness) Wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-h.Exited:
		if err != nil {
			t.Fatalf("gorovod run: %v\n%s", err, h.LogText())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the job did not finish; launcher log:\n%s", h.LogText())
	}
}
