package membership

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The kill -9 test re-runs this test binary as a member process: TestMain sees
// childEnv and runs runChild instead of the tests.
const (
	childEnv       = "GOROVOD_MEMBERSHIP_CHILD"
	childSeedEnv   = "GOROVOD_MEMBERSHIP_CHILD_SEED"
	childSecretEnv = "GOROVOD_MEMBERSHIP_CHILD_SECRET"
	childJobEnv    = "GOROVOD_MEMBERSHIP_CHILD_JOB"
	// childLifetime bounds a child whose parent vanished without closing its stdin.
	childLifetime = time.Minute
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if os.Getenv(hostChildEnv) != "" {
		os.Exit(runHostChild())
	}
	os.Exit(m.Run())
}

// runChild joins the cluster named by the environment, prints "READY name",
// and stays a member until its stdin closes (or it is killed, which is the
// point).
func runChild() int {
	cfg := DefaultConfig()
	cfg.Secret = []byte(os.Getenv(childSecretEnv))
	cfg.Seeds = []string{os.Getenv(childSeedEnv)}
	cfg.Logger = testLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Join(ctx, cfg, Meta{JobID: os.Getenv(childJobEnv), CollectiveAddr: "127.0.0.1:1", GPUs: GPUsUnknown})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer m.Shutdown()
	fmt.Printf("READY %s\n", m.Name())
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-time.After(childLifetime):
	}
	return 0
}

// TestKill9SeenAsFailed: a real member process killed with SIGKILL (no chance
// to say anything) is reported Failed by the others within detectBound.
func TestKill9SeenAsFailed(t *testing.T) {
	seed := join(t, testConfig("m0"), testMeta(0))
	cfg := testConfig("m1")
	cfg.Seeds = []string{seed.Local().Addr.String()}
	watcher := join(t, cfg, testMeta(1))
	observers := []*Member{seed, watcher}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"=1",
		childSeedEnv+"="+seed.Local().Addr.String(),
		childSecretEnv+"="+string(testSecret),
		childJobEnv+"="+testJob,
	)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if name, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- name
			}
		}
		close(ready)
	}()
	var name string
	select {
	case n, ok := <-ready:
		if !ok {
			t.Fatal("child exited before joining")
		}
		name = n
	case <-time.After(15 * time.Second):
		t.Fatal("child did not join")
	}
	for _, m := range observers {
		waitFor(t, m, time.Now().Add(joinBound), "child joined", func() bool { return hasMember(m, name) })
	}

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, m := range observers {
		e := waitEvent(t, m, start.Add(detectBound), "kill -9 detection", func(e Event) bool {
			return e.Node.Name == name && (e.Kind == EventLeft || e.Kind == EventFailed)
		})
		if e.Kind != EventFailed {
			t.Fatalf("%s saw %v, want failed", m.Name(), e)
		}
		t.Logf("%s saw the kill -9 after %v", m.Name(), e.At.Sub(start).Round(time.Millisecond))
	}
}
