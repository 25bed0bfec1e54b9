package testhosts_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/testhosts"
)

func newNet(t *testing.T, k int) (*testhosts.Net, []*testhosts.Host) {
	t.Helper()
	t0 := time.Now()
	n, hs := testhosts.NewHosts(t, testhosts.Config{}, k)
	t.Logf("%d hosts up in %v", k, time.Since(t0).Round(time.Millisecond))
	return n, hs
}

// serve listens on h and runs handle for every connection until the test ends.
func serve(t *testing.T, h *testhosts.Host, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := h.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln
}

// TestHostsAreSeparateMachines: over ssh, each host has its own name, its own
// address, its own /dev/shm and network stack, and resolves the others' names.
func TestHostsAreSeparateMachines(t *testing.T) {
	_, hs := newNet(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	shm := map[string]string{}
	netns := map[string]string{}
	// Each host asks the next one, around the ring.
	for i, from := range hs {
		for _, to := range []*testhosts.Host{hs[(i+1)%len(hs)]} {
			out, err := from.SSH(ctx, to, "hostname; stat -c %d:%i /dev/shm; readlink /proc/self/ns/net; getent hosts h1 | cut -d' ' -f1; ip -o -4 addr show dev eth0 | tr -s ' ' | cut -d' ' -f4")
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(out))
			if len(f) != 5 {
				t.Fatalf("%s -> %s: unexpected output %q", from, to, out)
			}
			if f[0] != to.Name || f[3] != hs[0].Addr.String() || f[4] != to.Addr.String()+"/24" {
				t.Errorf("%s -> %s: hostname %s, h1 resolves to %s, eth0 has %s", from, to, f[0], f[3], f[4])
			}
			shm[to.Name], netns[to.Name] = f[1], f[2]
		}
	}
	for _, a := range hs {
		for _, b := range hs {
			if a != b && (shm[a.Name] == shm[b.Name] || netns[a.Name] == netns[b.Name]) {
				t.Errorf("%s and %s share /dev/shm (%s) or a network namespace (%s)", a, b, shm[a.Name], netns[a.Name])
			}
		}
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	if slices.ContainsFunc(hs, func(h *testhosts.Host) bool { return netns[h.Name] == self }) {
		t.Errorf("a host runs in the test's own network namespace %s", self)
	}
}

// TestListenAndDial: sockets made with Do stay in their host; the root
// namespace cannot reach the hosts at all.
func TestListenAndDial(t *testing.T) {
	_, hs := newNet(t, 2)
	ln := serve(t, hs[1], func(c net.Conn) { fmt.Fprintf(c, "from %s\n", c.LocalAddr()) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := hs[0].Dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if want := "from " + ln.Addr().String() + "\n"; string(b) != want {
		t.Errorf("read %q, want %q", b, want)
	}
	if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != hs[0].Addr.String() {
		t.Errorf("dialled from %s, want %s", got, hs[0].Addr)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	var d net.Dialer
	if c, err := d.DialContext(short, "tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("the test's own namespace reached a host")
	}
}

// TestKillAllAndRestart: kill -9 reaches every process of the host (sshd,
// sessions, what they started, what Command started) and nothing else; the
// host then refuses ssh until Start.
func TestKillAllAndRestart(t *testing.T) {
	_, hs := newNet(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A session that leaves a process behind, detached from it.
	if _, err := hs[0].SSH(ctx, hs[1], "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatal(err)
	}
	// Started with Command, and in the host once it has said so.
	direct := hs[1].Command(ctx, "sh", "-c", "echo in; exec sleep 1000")
	stdout, err := direct.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(stdout, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	bystander := exec.Command("sleep", "1000")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bystander.Process.Kill(); _ = bystander.Wait() }()
	pids, err := hs[1].Processes()
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) < 3 || !slices.Contains(pids, direct.Process.Pid) || slices.Contains(pids, bystander.Process.Pid) {
		t.Fatalf("processes of %s: %v (Command's %d, the bystander %d)", hs[1], pids, direct.Process.Pid, bystander.Process.Pid)
	}
	t0 := time.Now()
	if err := hs[1].KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("KillAll took %v", time.Since(t0).Round(time.Millisecond))
	if err := direct.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Command's process ended with %v, want killed", err)
	}
	if left, _ := hs[1].Processes(); len(left) != 0 {
		t.Errorf("processes left on %s: %v", hs[1], left)
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a process outside the host was hit: %v", err)
	}
	if hs[1].Running() {
		t.Error("host still running after KillAll")
	}
	if _, err := hs[0].SSH(ctx, hs[1], "true"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("ssh to a killed host: %v, want connection refused", err)
	}
	if err := hs[1].Command(ctx, "true").Run(); err == nil {
		t.Error("Command ran on a killed host")
	}
	if err := hs[1].Start(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := hs[0].SSH(ctx, hs[1], "ls /dev/shm | wc -l; hostname"); err != nil || strings.Fields(string(out))[1] != hs[1].Name {
		t.Errorf("after Start: %q, %v", out, err)
	}
}

// TestLinkDown: an unplugged host is silent (a connection attempt times out,
// nothing is refused) until plugged back in.
func TestLinkDown(t *testing.T) {
	_, hs := newNet(t, 2)
	ln := serve(t, hs[1], func(net.Conn) {})
	dial := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := hs[0].Dial(ctx, "tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := hs[1].SetLink(false); err != nil {
		t.Fatal(err)
	}
	if err := dial(500 * time.Millisecond); !isTimeout(err) {
		t.Errorf("dial across an unplugged link: %v, want a timeout", err)
	}
	if err := hs[1].SetLink(true); err != nil {
		t.Fatal(err)
	}
	if err := dial(5 * time.Second); err != nil {
		t.Errorf("dial after plugging back in: %v", err)
	}
}

func TestCleanupRemovesEverything(t *testing.T) {
	if err := testhosts.Available(); err != nil && os.Getenv(testhosts.EnvRequire) == "" {
		t.Skip(err)
	}
	n, err := testhosts.New(testhosts.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hs, err := n.AddHosts(ctx, 2)
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	var pids []int
	for _, h := range hs {
		p, _ := h.Processes()
		pids = append(pids, p...)
	}
	dir := n.Dir()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), n.ID()) {
			t.Errorf("namespace %s left behind", e.Name())
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind (%v)", dir, err)
	}
	for _, p := range pids {
		if err := syscall.Kill(p, 0); err == nil {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); !strings.Contains(string(b), ") Z ") {
				t.Errorf("process %d of a removed host still runs", p)
			}
		}
	}
}

// TestStaleNamespacesRemoved: a namespace named by a harness whose process is
// gone is removed by the next harness; one of a live process is not.
func TestStaleNamespacesRemoved(t *testing.T) {
	if err := testhosts.Available(); err != nil && os.Getenv(testhosts.EnvRequire) == "" {
		t.Skip(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("gvhstale%d-0000-sw", dead.Process.Pid)
	alive := fmt.Sprintf("gvhstale%d-0000-sw", os.Getpid())
	for _, name := range []string{stale, alive} {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v %s", name, err, out)
		}
	}
	defer exec.Command("ip", "netns", "del", alive).Run()
	defer exec.Command("ip", "netns", "del", stale).Run()
	n, err := testhosts.New(testhosts.Config{Prefix: "gvhstale"})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if _, err := os.Stat("/run/netns/" + stale); !os.IsNotExist(err) {
		t.Errorf("stale namespace %s not removed (%v)", stale, err)
	}
	if _, err := os.Stat("/run/netns/" + alive); err != nil {
		t.Errorf("namespace of a live harness removed: %v", err)
	}
}

// BenchmarkHostLifecycle: what a host costs a test — namespaces, link,
// address, keys, sshd accepting — and removing it again.
func BenchmarkHostLifecycle(b *testing.B) {
	n := testhosts.NewT(b, testhosts.Config{})
	ctx := context.Background()
	var up, down time.Duration
	for b.Loop() {
		t0 := time.Now()
		h, err := n.AddHost(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := n.RemoveHost(h); err != nil {
			b.Fatal(err)
		}
		up, down = up+t1.Sub(t0), down+time.Since(t1)
	}
	b.ReportMetric(float64(up.Milliseconds())/float64(b.N), "ms-up/op")
	b.ReportMetric(float64(down.Milliseconds())/float64(b.N), "ms-down/op")
}
