package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestSchedulerPacingFlags checks that the scheduler refuses negative round
// pacing before it reaches for a cluster.
func TestSchedulerPacingFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"negative event delay", []string{"--event-delay", "-1s"}},
		{"negative gap", []string{"--min-round-gap", "-2s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := gorovod(context.Background(), append([]string{"scheduler"}, tc.args...)...)
			if !errors.Is(err, ErrUsage) || !strings.Contains(stderr, "must not be negative") {
				t.Fatalf("err %v, stderr %q; want a usage error about the negative flag", err, stderr)
			}
		})
	}
}
