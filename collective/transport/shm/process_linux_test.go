package shm_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

// The process tests re-run this test binary as a child: with envChild set,
// TestMain plays that scenario instead of running the tests.
const (
	envChild      = "GOROVOD_SHM_TEST_CHILD"
	envParentAddr = "GOROVOD_SHM_TEST_PARENT"
	envSingleCopy = "GOROVOD_SHM_TEST_SINGLE_COPY"
)

func TestMain(m *testing.M) {
	if s := os.Getenv(envChild); s != "" {
		if err := childMain(s); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childMain is rank 1 of a 2-rank world whose rank 0 is the test process. It
// reports on stdout, then blocks on stdin until the test kills it.
func childMain(scenario string) error {
	if scenario == "stale" {
		// A process that dies in the middle of a setup, its files created.
		name, err := shm.CreateStaleFiles("/dev/shm", transport.JobHash("stale"), 1)
		if err != nil {
			return err
		}
		fmt.Println("ready", name)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return nil
	}
	cfg := testConfig()
	if v := os.Getenv(envSingleCopy); v != "" {
		cfg.SingleCopyBytes, _ = strconv.Atoi(v)
	}
	t, err := shm.Listen(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	links, err := t.Connect(ctx, transport.World{JobID: "kill", Epoch: 1, Rank: 1, Addrs: []string{os.Getenv(envParentAddr), ""}})
	if err != nil {
		return err
	}
	l := links[0]
	hello := []byte("hello from the child")
	h := transport.Header{Kind: transport.FrameData, Length: uint32(len(hello))}
	if err := l.Send(ctx, &h, hello); err != nil {
		return err
	}
	switch scenario {
	case "idle":
	case "sending":
		// A frame far larger than the ring: the child stays blocked in Send,
		// with part of the frame in the ring, since the parent reads only the header.
		fmt.Println("ready")
		big := make([]byte, 64<<20)
		h := transport.Header{Kind: transport.FrameData, Length: uint32(len(big))}
		if err := l.Send(context.Background(), &h, big); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown scenario %q", scenario)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// child starts a child process playing scenario and waits until it says it is
// ready. The child is killed when the test ends, if it is not dead by then.
type child struct {
	cmd   *exec.Cmd
	lines *bufio.Scanner
}

func startChild(t *testing.T, scenario string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envChild+"="+scenario), env...)
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: bufio.NewScanner(out)}
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	return c
}

// waitLine returns the child's next line, which must start with prefix.
func (c *child) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		if c.lines.Scan() {
			got <- c.lines.Text()
		}
		close(got)
	}()
	select {
	case line, ok := <-got:
		if !ok || !strings.HasPrefix(line, prefix) {
			t.Fatalf("child said %q, want %q", line, prefix)
		}
		return line
	case <-time.After(20 * time.Second):
		t.Fatalf("child did not say %q", prefix)
		return ""
	}
}

// kill9 kills the child as a crash would and reaps it.
func (c *child) kill9(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
}

// connectChild connects this process, as rank 0, to a child process as rank 1.
func connectChild(t *testing.T, scenario string, singleCopy int) (transport.Link, *child) {
	t.Helper()
	cfg := testConfig()
	cfg.SingleCopyBytes = singleCopy
	tr := listen(t, cfg)
	c := startChild(t, scenario, envParentAddr+"="+tr.Addr(), envSingleCopy+"="+strconv.Itoa(singleCopy))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	links, err := tr.Connect(ctx, transport.World{JobID: "kill", Epoch: 1, Rank: 0, Addrs: []string{tr.Addr(), ""}})
	if err != nil {
		t.Fatal(err)
	}
	l := links[1]
	t.Cleanup(func() { l.Close() })
	var h transport.Header
	if err := l.RecvHeader(ctx, &h); err != nil {
		t.Fatal(err)
	}
	if err := l.RecvPayload(ctx, make([]byte, h.Length)); err != nil {
		t.Fatal(err)
	}
	return l, c
}

// TestKillPeer: a peer process killed with SIGKILL — while this side waits to
// receive, waits to send, or is in the middle of a frame — fails the blocked
// call promptly with ErrPeerClosed, and nothing is left in /dev/shm.
func TestKillPeer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		scenario   string
		singleCopy int
		before     func(ctx context.Context, l transport.Link) error // before the kill
		op         func(ctx context.Context, l transport.Link) error // blocked when the kill comes
	}{
		{"while receiving", "idle", 0, nil, func(ctx context.Context, l transport.Link) error {
			var h transport.Header
			return l.RecvHeader(ctx, &h)
		}},
		{"while sending through the ring", "idle", -1, nil, func(ctx context.Context, l transport.Link) error {
			payload := make([]byte, 1<<20)
			for i := 0; ; i++ {
				h := transport.Header{Kind: transport.FrameData, Seq: uint64(i), Length: uint32(len(payload))}
				if err := l.Send(ctx, &h, payload); err != nil {
					return err
				}
			}
		}},
		{"while its single copy is awaited", "idle", singleCopyOn, nil, func(ctx context.Context, l transport.Link) error {
			payload := make([]byte, 1<<20)
			h := transport.Header{Kind: transport.FrameData, Length: uint32(len(payload))}
			return l.Send(ctx, &h, payload)
		}},
		{"mid-frame", "sending", -1, func(ctx context.Context, l transport.Link) error {
			// The child is left blocked in Send with the start of its frame in the ring.
			var h transport.Header
			if err := l.RecvHeader(ctx, &h); err != nil {
				return err
			}
			if h.Length != 64<<20 {
				return fmt.Errorf("frame of %d bytes", h.Length)
			}
			return nil
		}, func(ctx context.Context, l transport.Link) error {
			return l.RecvPayload(ctx, make([]byte, 64<<20))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkShmEmpty(t)
			l, c := connectChild(t, tc.scenario, tc.singleCopy)
			c.waitLine(t, "ready")
			if left := shmFiles("/dev/shm"); len(left) > 0 {
				t.Errorf("files in /dev/shm while the world runs: %v", left)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if tc.before != nil {
				if err := tc.before(ctx, l); err != nil {
					t.Fatal(err)
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- tc.op(ctx, l) }()
			c.kill9(t)
			start := time.Now()
			select {
			case err := <-errc:
				var pe *transport.PeerError
				if !errors.As(err, &pe) || pe.Rank != 1 || !errors.Is(err, transport.ErrPeerClosed) {
					t.Fatalf("after the kill: %v, want a PeerError for rank 1 wrapping ErrPeerClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the blocked call did not notice the peer's death")
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("the peer's death took %v to notice", d)
			}
		})
	}
}

// TestStaleFilesOfDeadProcess: files left by a process killed in the middle
// of a setup are removed by the next transport created on the host.
func TestStaleFilesOfDeadProcess(t *testing.T) {
	checkShmEmpty(t)
	c := startChild(t, "stale")
	name := strings.TrimPrefix(c.waitLine(t, "ready "), "ready ")
	pid := c.cmd.Process.Pid
	if got := filesOf("/dev/shm", pid); len(got) != 5 || !strings.HasPrefix(got[0], name) {
		t.Fatalf("the child made %v, want the 5 files of %s", got, name)
	}
	c.kill9(t)
	listen(t, testConfig()) // sweeps
	if left := filesOf("/dev/shm", pid); len(left) > 0 {
		t.Fatalf("left after a new transport started: %v", left)
	}
}
