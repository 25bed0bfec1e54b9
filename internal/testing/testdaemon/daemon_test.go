package testdaemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestStopAndMarked: a daemon is found by its marker and stopped by SIGTERM;
// one that ignores SIGTERM is killed and the error says so.
func TestStopAndMarked(t *testing.T) {
	dir := t.TempDir()
	marker := "TESTDAEMON_MARKER=" + dir
	env := append(os.Environ(), marker)
	polite, err := Start("polite", []string{"sleep", "100"}, env, filepath.Join(dir, "polite.log"))
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := Start("stubborn", []string{"sh", "-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`}, env, filepath.Join(dir, "stubborn.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := WaitFor(ctx, 10*time.Millisecond, func() error {
		if !strings.Contains(stubborn.Tail(100), "ready") {
			return errors.New("not ready")
		}
		return nil
	}, stubborn); err != nil {
		t.Fatal(err)
	}
	marked := Marked(Marker{Env: marker})
	if !slices.Contains(marked, polite.PID()) || !slices.Contains(marked, stubborn.PID()) {
		t.Fatalf("marked %v, want %d and %d", marked, polite.PID(), stubborn.PID())
	}
	if got := Marked(Marker{Cmdline: "trap \"\" TERM"}); !slices.Contains(got, stubborn.PID()) {
		t.Fatalf("by command line: %v", got)
	}
	if err := polite.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := stubborn.Stop(300 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "ignored SIGTERM") {
		t.Fatalf("stopping a daemon that ignores SIGTERM: %v", err)
	}
	// sleep children of the stubborn shell may linger a moment; the
	// daemons themselves are gone.
	for _, pid := range Marked(Marker{Env: marker}) {
		if pid == polite.PID() || pid == stubborn.PID() {
			t.Fatalf("pid %d still there", pid)
		}
	}
	_ = KillMarked(Marker{Env: marker})
}

// TestWaitForNamesTheDeadDaemon: waiting on a daemon that exits ends at once
// with its log.
func TestWaitForNamesTheDeadDaemon(t *testing.T) {
	dir := t.TempDir()
	d, err := Start("quitter", []string{"sh", "-c", "echo bad config; exit 3"}, nil, filepath.Join(dir, "q.log"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = WaitFor(ctx, 10*time.Millisecond, func() error { return errors.New("not up") }, d)
	if err == nil || !strings.Contains(err.Error(), "quitter exited") || !strings.Contains(err.Error(), "bad config") {
		t.Fatalf("got %v", err)
	}
}

func TestRetryPortTaken(t *testing.T) {
	calls := 0
	_, err := RetryPortTaken(context.Background(), 3, func() (int, error) {
		calls++
		return 0, fmt.Errorf("slurmd: %w", ErrPortTaken)
	})
	if calls != 3 || !errors.Is(err, ErrPortTaken) {
		t.Fatalf("%d calls, %v", calls, err)
	}
	calls = 0
	v, err := RetryPortTaken(context.Background(), 3, func() (int, error) {
		calls++
		if calls == 2 {
			return 7, nil
		}
		return 0, ErrPortTaken
	})
	if calls != 2 || v != 7 || err != nil {
		t.Fatalf("%d calls, %d, %v", calls, v, err)
	}
	calls = 0
	if _, err := RetryPortTaken(context.Background(), 3, func() (int, error) { calls++; return 0, errors.New("bad config") }); calls != 1 || err == nil {
		t.Fatalf("%d calls for another error", calls)
	}
	ports, err := FreePorts(3)
	if err != nil || len(ports) != 3 || ports[0] == ports[1] {
		t.Fatalf("%v %v", ports, err)
	}
}
