package shm_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/internal/spin"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

func TestHostID(t *testing.T) {
	a, err := shm.HostID("/dev/shm")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := shm.HostID("/dev/shm")
	if a != b || len(a) != 32 {
		t.Fatalf("HostID = %q then %q", a, b)
	}
	// Another file system is another sharing domain.
	if c, err := shm.HostID(t.TempDir()); err == nil && c == a && !strings.HasPrefix(t.TempDir(), "/dev/shm") {
		t.Logf("note: %s is on the same file system as /dev/shm", t.TempDir())
	}
	if _, err := shm.HostID("/nonexistent/dir"); err == nil {
		t.Error("HostID of a missing dir succeeded")
	}
}

// kindOf tells a shared-memory link from a bootstrap (TCP) one.
func kindOf(l transport.Link) string {
	if strings.Contains(fmt.Sprintf("%T", l), "shm.") {
		return "shm"
	}
	return "tcp"
}

func connectHosts(t *testing.T, hosts []string, fallback bool) ([][]transport.Link, []error, []string) {
	t.Helper()
	trs := make([]*shm.Transport, len(hosts))
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		cfg := testConfig()
		cfg.HostID, cfg.Fallback = h, fallback
		trs[i] = listen(t, cfg)
		addrs[i] = trs[i].Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	links := make([][]transport.Link, len(hosts))
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for r, tr := range trs {
		wg.Go(func() {
			links[r], errs[r] = tr.Connect(ctx, transport.World{JobID: "hosts", Epoch: 1, Rank: r, Addrs: addrs})
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, ls := range links {
			for _, l := range ls {
				if l != nil {
					l.Close()
				}
			}
		}
	})
	return links, errs, addrs
}

// TestOtherHost: without Fallback, a pair on two hosts fails Connect on both
// sides with a fatal HandshakeError; with it, the pair keeps its TCP link.
func TestOtherHost(t *testing.T) {
	checkShmEmpty(t)
	t.Run("strict", func(t *testing.T) {
		_, errs, _ := connectHosts(t, []string{"host-a", "host-b"}, false)
		for r, err := range errs {
			var he *transport.HandshakeError
			if !errors.As(err, &he) || he.Rank != 1-r || !he.Fatal || !strings.Contains(err.Error(), "another host") {
				t.Errorf("rank %d: %v, want a fatal HandshakeError about rank %d on another host", r, err, 1-r)
			}
		}
	})
	t.Run("fallback", func(t *testing.T) {
		links, errs, _ := connectHosts(t, []string{"host-a", "host-b"}, true)
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		if k := kindOf(links[0][1]); k != "tcp" {
			t.Errorf("link between hosts is %s", k)
		}
	})
}

// TestMixedWorld: ranks 0, 1 on one "host" and 2, 3 on another: pairs on one
// host share memory, the others use TCP, and the collectives work across both.
func TestMixedWorld(t *testing.T) {
	checkShmEmpty(t)
	hosts := []string{"host-a", "host-a", "host-b", "host-b"}
	links, errs, addrs := connectHosts(t, hosts, true)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range hosts {
		for p := range hosts {
			if p == r {
				continue
			}
			want := "tcp"
			if hosts[p] == hosts[r] {
				want = "shm"
			}
			if got := kindOf(links[r][p]); got != want {
				t.Errorf("link %d->%d is %s, want %s", r, p, got, want)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := collective.DefaultConfig()
	cfg.ChunkBytes = 64 << 10
	var wg sync.WaitGroup
	res := make([]error, len(hosts))
	for r := range hosts {
		wg.Go(func() {
			c, err := collective.NewFromLinks(transport.World{JobID: "hosts", Epoch: 1, Rank: r, Addrs: addrs}, links[r], cfg)
			if err != nil {
				res[r] = err
				return
			}
			defer c.Close()
			for _, n := range []int{10, 3000, 1 << 20} {
				buf := make([]float32, n)
				for i := range buf {
					buf[i] = float32(r + i%3)
				}
				if err := collective.Allreduce(ctx, c, buf, buf, collective.Sum); err != nil {
					res[r] = err
					return
				}
				for i, v := range buf {
					if want := float32(0+1+2+3) + float32(4*(i%3)); v != want {
						res[r] = fmt.Errorf("rank %d, %d elements: element %d is %v, want %v", r, n, i, v, want)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(res...); err != nil {
		t.Fatal(err)
	}
}

// TestOversubscribedHost: when a host's ranks outnumber its CPUs, its
// shared-memory links send every frame through the ring and their polls also
// yield to other processes; with a CPU per rank they do neither. Though such
// polls may last longer (spin.YieldingFactor), a call blocked on a silent
// peer still sleeps.
func TestOversubscribedHost(t *testing.T) {
	checkShmEmpty(t)
	cpus := spin.HostCPUs()
	sizes := []int{2, cpus + 1}
	if cpus+1 > 16 {
		sizes = sizes[:1] // a world larger than the host's CPUs would be too big a test here
	}
	for _, n := range sizes {
		links, errs, _ := connectHosts(t, slices.Repeat([]string{"host-a"}, n), false)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for r := range links {
			for p, l := range links[r] {
				if l == nil {
					continue
				}
				yields, single := shm.Oversubscription(l)
				if over := n > cpus; yields != over || (over && single) {
					t.Errorf("world of %d on %d CPUs: link %d→%d yields to processes %v, single copy %v", n, cpus, r, p, yields, single)
				}
			}
		}
		if n > cpus {
			silentPeerSleeps(t, links[0][1])
		}
	}
}

// silentPeerSleeps: three receives from a peer that sends nothing, 300 ms
// each; the quietest must use under a tenth of a core (one that polled
// throughout would use all of it; the process's garbage collector or another
// test's goroutine may add to one wait).
func silentPeerSleeps(t *testing.T, l transport.Link) {
	t.Helper()
	quietest := 1.0
	var waits []string
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		cpu0, t0 := processCPU(t), time.Now()
		var h transport.Header
		err := l.RecvHeader(ctx, &h)
		cpu, elapsed := processCPU(t)-cpu0, time.Since(t0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("receive from a silent peer: %v, want the context's deadline", err)
		}
		quietest = min(quietest, cpu.Seconds()/elapsed.Seconds())
		waits = append(waits, fmt.Sprintf("%v of CPU in %v", cpu, elapsed.Round(time.Millisecond)))
	}
	t.Logf("oversubscribed, blocked on a silent peer: %s", strings.Join(waits, ", "))
	if quietest > 0.1 {
		t.Errorf("oversubscribed, blocked on a silent peer, the quietest of three waits used %.0f%% of a core: %s",
			100*quietest, strings.Join(waits, ", "))
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
