package job_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/job/hosts"
	"github.com/gorovod/gorovod/job/launch"
)

// fakeSSH writes an ssh client for tests: it logs its command line, then
// runs the remote command here with sh, as sshd would run it in the user's
// shell. Host "refused" fails as a refused connection does (status 255 and
// ssh's message); host "silent" connects and never runs anything.
func fakeSSH(t *testing.T) (command []string, calls func() []string) {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(dir, "calls")
	script := filepath.Join(dir, "ssh")
	body := `#!/bin/sh
printf '%s\n@@call@@\n' "$*" >> ` + logFile + `
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
host=$1
shift
case "$host" in
refused) echo "ssh: connect to host refused port 22: Connection refused" >&2; exit 255 ;;
silent) exec sleep 600 ;;
esac
exec sh -c "$*"
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{script}, func() []string {
		b, _ := os.ReadFile(logFile)
		return strings.Split(strings.TrimSuffix(string(b), "\n@@call@@\n"), "\n@@call@@\n")
	}
}

// lines collects a process's output.
type lines struct {
	mu  sync.Mutex
	out []string
}

func (l *lines) add(stream string, line []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.out = append(l.out, stream+": "+string(line))
}

func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.out, s)
}

// SSHLauncher over a fake ssh client: what a remote worker's end becomes in
// the job's terms (nil, an *ExitError with its host, a signal that
// KilledBySignal sees, a *launch.HostError), its output per stream, signals
// forwarded, the job secret on no command line, and this host's workers
// started without ssh.
func TestSSHLauncher(t *testing.T) {
	const secret = "GOROVOD_SECRET=not-on-any-command-line"
	for _, tc := range []struct {
		name   string
		host   string
		script string // the worker: sh -c script
		signal syscall.Signal
		check  func(t *testing.T, err error, out *lines)
		viaSSH bool
	}{
		{name: "exit 0", host: "h1", viaSSH: true,
			script: `echo "secret $GOROVOD_SECRET"; echo err >&2`,
			check: func(t *testing.T, err error, out *lines) {
				if err != nil || !out.has("stdout: secret not-on-any-command-line") || !out.has("stderr: err") {
					t.Fatalf("err %v, output %q", err, out.out)
				}
			}},
		{name: "exit 3", host: "h1", viaSSH: true, script: "exit 3",
			check: func(t *testing.T, err error, _ *lines) {
				var ee *job.ExitError
				if !errors.As(err, &ee) || ee.Code != 3 || !strings.Contains(err.Error(), "on h1") || job.KilledBySignal(err) {
					t.Fatalf("err %v, want exit status 3 on h1", err)
				}
			}},
		{name: "kill -9", host: "h1", viaSSH: true, script: "kill -9 $$",
			check: func(t *testing.T, err error, _ *lines) {
				var ee *job.ExitError
				if !errors.As(err, &ee) || ee.Signal != syscall.SIGKILL || !job.KilledBySignal(err) {
					t.Fatalf("err %v, want killed by SIGKILL", err)
				}
			}},
		{name: "a signal forwarded", host: "h1", viaSSH: true, signal: syscall.SIGUSR1,
			script: `trap 'echo got USR1; exit 0' USR1; echo ready; while :; do sleep 0.05; done`,
			check: func(t *testing.T, err error, out *lines) {
				if err != nil || !out.has("stdout: got USR1") {
					t.Fatalf("err %v, output %q", err, out.out)
				}
			}},
		{name: "refused", host: "refused", viaSSH: true, script: "exit 0",
			check: func(t *testing.T, err error, _ *lines) {
				var he *launch.HostError
				if !errors.As(err, &he) || he.Host != "refused" || !strings.Contains(err.Error(), "Connection refused") {
					t.Fatalf("err %v, want a *launch.HostError for host refused with ssh's message", err)
				}
			}},
		{name: "not started in time", host: "silent", viaSSH: true, script: "exit 0",
			check: func(t *testing.T, err error, _ *lines) {
				var he *launch.HostError
				if !errors.As(err, &he) || he.Host != "silent" || !strings.Contains(err.Error(), "did not start within") {
					t.Fatalf("err %v, want a *launch.HostError: not started within the start timeout", err)
				}
			}},
		{name: "localhost runs here", host: "localhost", script: `echo "secret $GOROVOD_SECRET"`,
			check: func(t *testing.T, err error, out *lines) {
				if err != nil || !out.has("stdout: secret not-on-any-command-line") {
					t.Fatalf("err %v, output %q", err, out.out)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			command, calls := fakeSSH(t)
			l := &job.SSHLauncher{SSH: launch.SSH{Command: command, StartTimeout: time.Second}, StopGrace: time.Second}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out := &lines{}
			p, err := l.Launch(ctx, job.LaunchRequest{Index: 0, Host: tc.host, Argv: []string{"sh", "-c", tc.script},
				Env: []string{secret}, Share: 1, Output: out.add})
			if err != nil {
				t.Fatal(err)
			}
			if tc.signal != 0 {
				deadline := time.Now().Add(30 * time.Second)
				for !out.has("stdout: ready") {
					if time.Now().After(deadline) {
						t.Fatalf("the worker never said it was ready: %q", out.out)
					}
					select {
					case <-p.Done():
						t.Fatalf("the worker ended before it was signalled: %v, %q", p.Err(), out.out)
					case <-time.After(10 * time.Millisecond):
					}
				}
				if err := p.Signal(tc.signal); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-p.Done():
			case <-ctx.Done():
				t.Fatal("the worker did not end")
			}
			tc.check(t, p.Err(), out)
			logged := calls()
			if via := logged[0] != ""; via != tc.viaSSH {
				t.Fatalf("started through ssh: %v, want %v (ssh calls %q)", via, tc.viaSSH, logged)
			}
			for _, c := range logged {
				if strings.Contains(c, "not-on-any-command-line") {
					t.Fatalf("the job secret is on ssh's command line: %q", c)
				}
				if tc.viaSSH && !strings.Contains(c, "-- "+tc.host+" ") {
					t.Fatalf("ssh was not asked for host %s: %q", tc.host, c)
				}
			}
		})
	}
}

// HostWatch over a fixed list and over a script: the first list, a
// blacklisted host taken out (once; for good, or until its cooldown ends),
// an unknown host ignored, a failing script keeping the hosts, a changed
// script output reported.
func TestHostWatch(t *testing.T) {
	type report = []job.Host
	watch := func(t *testing.T, src hosts.Discovery, cfg hosts.WatchConfig) (*job.HostWatch, chan report, chan string) {
		t.Helper()
		w := job.NewHostWatch(src, cfg)
		reports, msgs := make(chan report, 16), make(chan string, 16)
		w.OnError = func(m string) { msgs <- m }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Discover(ctx, func(hs []job.Host) { reports <- hs }) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Discover: %v", err)
			}
		})
		return w, reports, msgs
	}
	next := func(t *testing.T, what string, c chan report) report {
		t.Helper()
		select {
		case r := <-c:
			return r
		case <-time.After(30 * time.Second):
			t.Fatalf("no report: %s", what)
			return nil
		}
	}
	say := func(t *testing.T, c chan string, want string) {
		t.Helper()
		select {
		case m := <-c:
			if !strings.Contains(m, want) {
				t.Fatalf("message %q, want %q", m, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no message %q", want)
		}
	}
	quiet := func(t *testing.T, reports chan report, msgs chan string) {
		t.Helper()
		select {
		case r := <-reports:
			t.Fatalf("unexpected report %v", r)
		case m := <-msgs:
			t.Fatalf("unexpected message %q", m)
		default:
		}
	}
	ab := hosts.Static{{Name: "a", Slots: 2}, {Name: "b", Slots: 1}}

	t.Run("blacklisted for good", func(t *testing.T) {
		w, reports, msgs := watch(t, ab, hosts.WatchConfig{Interval: 50 * time.Millisecond})
		if r := next(t, "the first list", reports); !slices.Equal(r, report{{"a", 2}, {"b", 1}}) {
			t.Fatalf("first list %v", r)
		}
		w.Blacklist("b")
		say(t, msgs, "host b lost a worker: blacklisted for good")
		if r := next(t, "the list without b", reports); !slices.Equal(r, report{{"a", 2}}) {
			t.Fatalf("after blacklisting b: %v", r)
		}
		w.Blacklist("b")      // again: nothing new
		w.Blacklist("nobody") // not a host of the list
		quiet(t, reports, msgs)
	})
	t.Run("cooldown", func(t *testing.T) {
		w, reports, msgs := watch(t, ab, hosts.WatchConfig{Interval: 50 * time.Millisecond,
			Cooldown: hosts.Cooldown{Min: hosts.MinCooldown, Max: hosts.MinCooldown}})
		next(t, "the first list", reports)
		blacklisted := time.Now()
		w.Blacklist("a")
		say(t, msgs, "host a lost a worker: blacklisted until")
		if r := next(t, "the list without a", reports); !slices.Equal(r, report{{"b", 1}}) {
			t.Fatalf("after blacklisting a: %v", r)
		}
		if r := next(t, "a back after its cooldown", reports); !slices.ContainsFunc(r, func(h job.Host) bool { return h.Name == "a" }) {
			t.Fatalf("after the cooldown: %v", r)
		} else if since := time.Since(blacklisted); since < hosts.MinCooldown {
			t.Fatalf("a came back after %v, within its cooldown of %v", since, hosts.MinCooldown)
		}
	})
	t.Run("script", func(t *testing.T) {
		list := filepath.Join(t.TempDir(), "hosts")
		write := func(s string) {
			if err := os.WriteFile(list+".new", []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(list+".new", list); err != nil {
				t.Fatal(err)
			}
		}
		write("a:1\n")
		_, reports, msgs := watch(t, hosts.Script{Command: "cat " + list}, hosts.WatchConfig{Interval: 50 * time.Millisecond})
		if r := next(t, "the first list", reports); !slices.Equal(r, report{{"a", 1}}) {
			t.Fatalf("first list %v", r)
		}
		if err := os.Remove(list); err != nil {
			t.Fatal(err)
		}
		say(t, msgs, "host discovery failed (keeping the hosts a:1)")
		write("a:1\nc:3\n")
		if r := next(t, "the list with c", reports); !slices.Equal(r, report{{"a", 1}, {"c", 3}}) {
			t.Fatalf("after c appeared: %v", r)
		}
	})
	t.Run("a failing first discovery is the error", func(t *testing.T) {
		w := job.NewHostWatch(hosts.Script{Command: "exit 4"}, hosts.WatchConfig{})
		w.Blacklist("a") // before Discover: nothing to take it out of
		err := w.Discover(context.Background(), func([]job.Host) { t.Error("reported hosts") })
		if err == nil {
			t.Fatal("Discover of a failing script succeeded")
		}
		t.Log(fmt.Sprint(err))
	})
}
