package slurm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testslurm"
	"github.com/gorovod/gorovod/job"
)

// TestLauncher runs workers as the job runner's processes through a real
// allocation: each is a step on the node the request names; its pid and
// step become known when it starts; signals reach the trainer through
// scancel (SIGTERM: it leaves; SIGKILL: it is killed, which the job
// survives); a worker's own exit status comes back as it was; and the end of
// the launch context stops a worker (job.StopSignal).
func TestLauncher(t *testing.T) {
	c := testslurm.New(t, testslurm.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	alloc, err := c.Allocate(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	// srun and scancel find the cluster through this process's environment.
	t.Setenv("SLURM_CONF", c.Conf)
	l, err := NewLauncher(LauncherConfig{JobID: alloc, StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	out := newLines()
	launch := func(ctx context.Context, i int, env ...string) *Step {
		t.Helper()
		p, err := l.Launch(ctx, job.LaunchRequest{Index: i, Host: c.NodeName, Argv: []string{testExe(t)},
			Env:    append(env, "GOROVOD_SECRET="+secretHex()),
			Output: func(stream string, line []byte) { out.add(i, stream, line) }})
		if err != nil {
			t.Fatal(err)
		}
		return p.(*Step)
	}
	// started waits for the wrapper's marker: it comes on stderr, the
	// worker's "ready" on stdout, and the two streams are read apart, so
	// "ready" can be seen first.
	started := func(s *Step) {
		t.Helper()
		waitCond(t, 30*time.Second, "the step's marker", func() (bool, string) {
			return s.ID() != "", fmt.Sprintf("step %q", s.ID())
		})
	}
	done := func(s *Step) error {
		t.Helper()
		select {
		case <-s.Done():
			return s.Err()
		case <-time.After(time.Minute):
			t.Fatalf("step %s did not end", s.ID())
			return nil
		}
	}

	// A worker that leaves on SIGTERM.
	leaver := launch(ctx, 0, envHelper+"=worker")
	ready := strings.Fields(out.wait(t, 0, "ready ", time.Minute))
	started(leaver)
	if pid, _ := strconv.Atoi(ready[2]); leaver.PID() != pid || leaver.Host() != ready[1] || !strings.HasPrefix(leaver.ID(), alloc+".") {
		t.Fatalf("step %q on %q pid %d; the worker reported %q", leaver.ID(), leaver.Host(), leaver.PID(), ready)
	}
	for _, l := range out.of(0) {
		if strings.HasPrefix(l, markerPrefix) {
			t.Fatalf("the wrapper's marker reached the output: %q", l)
		}
	}
	if err := leaver.Signal(job.LeaveSignal); err != nil {
		t.Fatal(err)
	}
	out.wait(t, 0, "left", 30*time.Second)
	if err := done(leaver); err != nil {
		t.Fatalf("a worker that left: %v", err)
	}

	// One that ignores SIGTERM, killed: lost, not failed.
	stubborn := launch(ctx, 1, envHelper+"=worker", envOnTerm+"=ignore")
	out.wait(t, 1, "ready ", time.Minute)
	started(stubborn)
	if err := stubborn.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var xe *job.ExitError
	if err := done(stubborn); !errors.As(err, &xe) || xe.Signal != syscall.SIGKILL || !job.KilledBySignal(err) {
		t.Fatalf("a killed worker: %v", err)
	}

	// One that fails by itself: its exit status, a failure.
	failing := launch(ctx, 2, envHelper+"=exit3")
	if err := done(failing); !errors.As(err, &xe) || xe.Code != 3 || job.KilledBySignal(err) {
		t.Fatalf("a worker that exited 3: %v", err)
	}

	// The end of the launch context stops a worker with job.StopSignal
	// (SIGINT, which the helper does not catch).
	wctx, stop := context.WithCancel(ctx)
	stopped := launch(wctx, 3, envHelper+"=worker", envOnTerm+"=ignore")
	out.wait(t, 3, "ready ", time.Minute)
	started(stopped)
	stop()
	if err := done(stopped); !errors.As(err, &xe) || xe.Signal != job.StopSignal {
		t.Fatalf("a stopped worker: %v", err)
	}
	waitCond(t, 30*time.Second, "the workers' steps to end", func() (bool, string) {
		s := steps(t, c, alloc)
		return len(s) == 0, fmt.Sprint(s)
	})
}

func TestParseNodes(t *testing.T) {
	out := "NodeName=n1 Arch=x86_64 NodeAddr=198.18.0.1 NodeHostName=host1 Version=22.05.8\n" +
		"NodeName=n2 NodeAddr=198.18.0.2 NodeHostName=host2.cluster.example\n\nNode nosuch not found\n"
	nodes := parseNodes(out)
	want := []Node{{"n1", "198.18.0.1", "host1"}, {"n2", "198.18.0.2", "host2.cluster.example"}}
	if fmt.Sprint(nodes) != fmt.Sprint(want) {
		t.Fatalf("parsed %+v, want %+v", nodes, want)
	}
	for _, tc := range []struct{ self, want string }{
		{"host1", "198.18.0.2"},
		{"host2", "198.18.0.1"},
		{"host1.cluster.example", "198.18.0.2"},
		{"login", "198.18.0.1"},
	} {
		if got := remoteNode(nodes, tc.self); got != tc.want {
			t.Errorf("from %s: remote node %q, want %q", tc.self, got, tc.want)
		}
	}
	if got := remoteNode(nodes[:1], "host1"); got != "" {
		t.Errorf("a one-node allocation on this host: remote node %q", got)
	}
}

func TestAllocationDiscovery(t *testing.T) {
	a := Allocation{JobID: "7", Hosts: []Host{{"n1", 2}, {"n2", 3}}, NTasks: 5}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan []job.Host, 1)
	go a.Discovery().Discover(ctx, func(h []job.Host) { got <- h })
	if h := <-got; fmt.Sprint(h) != "[{n1 2} {n2 3}]" {
		t.Fatalf("hosts %v", h)
	}
}
