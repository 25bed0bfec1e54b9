package e2e

import (
	"testing"
	"time"
)

// Poll calls cond every 100 ms (the API server's objects have no change
// notification here) until it holds or within passes.
func Poll(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server, as kubectl wait does
	}
}
