package heuristics

import (
	"strings"
	"testing"
)

// The built-in table is registered without Register's duplicate check.
func TestBuiltinNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range builtins() {
		if b.name == "" || b.factory == nil || b.summary == "" {
			t.Errorf("incomplete built-in %+v", b)
		}
		if seen[b.name] {
			t.Errorf("built-in %q twice", b.name)
		}
		seen[b.name] = true
	}
	r := NewRegistry()
	if got := len(r.Names()); got != len(seen) {
		t.Fatalf("%d names registered, want %d", got, len(seen))
	}
	if err := r.Register("hold", "again", newHoldHeuristic); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("re-registering a built-in: %v", err)
	}
}
