package hosts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestScript(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	hs, err := Script{Command: "printf 'h1:2\\nh2\\n'", DefaultSlots: 3}.Discover(ctx)
	if err != nil || Format(hs) != "h1:2,h2:3" {
		t.Errorf("got %q, %v", Format(hs), err)
	}
	bad := []struct {
		s    Script
		want string
	}{
		{Script{Command: "echo 'no hosts here' >&2; exit 3"}, "exit status 3: no hosts here"},
		{Script{Command: "echo 'h1:two'"}, "line 1"},
		{Script{Command: filepath.Join(dir, "missing.sh")}, "exit status 127"},
		{Script{Command: "  "}, "no command"},
		{Script{Command: "yes h1:1 | head -c 2000000"}, "more than"},
	}
	for _, b := range bad {
		if _, err := b.s.Discover(ctx); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%q: %v, want an error mentioning %q", b.s.Command, err, b.want)
		}
	}
}

// TestScriptTimeout: a script that hangs is killed with what it started, and
// Discover returns within the timeout. A loaded machine may kill the script
// before it wrote its child's pid: then again with twice the timeout.
func TestScriptTimeout(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child")
	var b []byte
	for timeout := 300 * time.Millisecond; len(b) == 0; timeout *= 2 {
		if timeout > 20*time.Second {
			t.Fatalf("the script never started its child: %s is empty", pidFile)
		}
		s := Script{Command: fmt.Sprintf("sleep 1000 & echo $! > %s; wait", pidFile), Timeout: timeout}
		t0 := time.Now()
		_, err := s.Discover(context.Background())
		if want := fmt.Sprintf("did not finish within %v", timeout); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error mentioning %q", err, want)
		}
		if took := time.Since(t0); took > timeout+3*time.Second {
			t.Errorf("took %v with a timeout of %v", took, timeout)
		}
		b, _ = os.ReadFile(pidFile)
	}
	var pid int
	fmt.Sscan(string(b), &pid)
	// The child is killed (perhaps a zombie until init reaps it).
	for deadline := time.Now().Add(5 * time.Second); ; {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the script's child %d still runs", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// TestWatch: a script whose answer the test changes; each change arrives,
// a failing run is reported and changes nothing, and a blacklisted host
// returns after its cooldown.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	answer := filepath.Join(dir, "hosts")
	write := func(s string) {
		t.Helper()
		tmp := answer + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, answer); err != nil {
			t.Fatal(err)
		}
	}
	write("h1:2\nh2:2\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, first, err := Watch(ctx, Script{Command: "cat " + answer}, WatchConfig{Interval: 20 * time.Millisecond, Cooldown: Cooldown{Min: time.Second, Max: time.Second}})
	if err != nil || Format(first) != "h1:2,h2:2" {
		t.Fatalf("Watch: %q, %v", Format(first), err)
	}
	next := func() Change {
		t.Helper()
		select {
		case c, ok := <-w.Changes():
			if !ok {
				t.Fatal("changes closed")
			}
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no change within 10s")
		}
		return Change{}
	}
	write("h1:2\nh2:2\nh3:1\n")
	if c := next(); Format(c.Added) != "h3:1" || Format(c.Hosts) != "h1:2,h2:2,h3:1" {
		t.Errorf("adding h3: %v", c)
	}
	write("h2:2\nh3:1\n")
	if c := next(); Format(c.Removed) != "h1:2" {
		t.Errorf("removing h1: %v", c)
	}
	write("h2:2\nh3:bad\n")
	if c := next(); c.Err == nil || !strings.Contains(c.Err.Error(), "line 2") || Format(c.Hosts) != "h2:2,h3:1" {
		t.Errorf("a bad answer: %v", c)
	}
	write("h2:2\nh3:1\n")
	c, until := w.Blacklist("h2")
	if Format(c.Removed) != "h2:2" || Format(w.Hosts()) != "h3:1" || time.Until(until) > time.Second {
		t.Errorf("blacklisting h2: %v until %v", c, until)
	}
	if c := next(); Format(c.Added) != "h2:2" || Format(c.Hosts) != "h3:1,h2:2" {
		t.Errorf("after h2's cooldown: %v", c)
	}
	if time.Now().Before(until) {
		t.Errorf("h2 back %v before its cooldown ended", time.Until(until))
	}
	cancel()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
	if _, ok := <-w.Changes(); ok {
		t.Error("a change after the end")
	}
}

func TestWatchFailsAtOnce(t *testing.T) {
	if _, _, err := Watch(context.Background(), Script{Command: "exit 1"}, WatchConfig{}); err == nil {
		t.Error("a failing first discovery was accepted")
	}
	if _, _, err := Watch(context.Background(), Static{}, WatchConfig{Cooldown: Cooldown{Min: time.Millisecond, Max: time.Second}}); err == nil {
		t.Error("a bad cooldown range was accepted")
	}
}

// TestScriptDoesNotSeeTheSecret: a discovery script that prints its
// environment finds no job secret, and the rest of the environment.
func TestScriptDoesNotSeeTheSecret(t *testing.T) {
	const secret = "5ec2e75ec2e75ec2e75ec2e75ec2e75e"
	t.Setenv("GOROVOD_SECRET", secret)
	t.Setenv("GOROVOD_TEST_KEPT", "kept-value")
	envFile := filepath.Join(t.TempDir(), "env")
	if _, err := (Script{Command: "env > '" + envFile + "'; echo h1:1"}).Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), secret) {
		t.Fatalf("the script sees the secret:\n%s", env)
	}
	if !strings.Contains(string(env), "GOROVOD_TEST_KEPT=kept-value") {
		t.Fatalf("the script lost the rest of the environment:\n%s", env)
	}
}
