package sync

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/testing/gossipforge"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// lineLog keeps a logger's records as "message k=v ..." lines (every one:
// the membership layer's repeats are let through with a 1 ns window).
type lineLog struct {
	mu    stdsync.Mutex
	lines []string
}

func (l *lineLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *lineLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lineLog) WithGroup(string) slog.Handler            { return l }
func (l *lineLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

func (l *lineLog) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			n++
		}
	}
	return n
}

// TestForgedGossipDeathKeepsTheWorld: a process that holds the job secret
// (and so the gossip key) sends memberlist's own suspect, dead and left
// messages about a live worker, correctly encrypted, to the driver and to
// every worker's gossip port, while three workers train. Gossip believes a
// death and the victim refutes it (TestInsiderForgedDeathIsRefuted in
// package membership); the job keeps its world: the proposer probes the
// worker gossip declared dead, it answers ("blamed worker is alive"), no
// epoch without it is proposed, and no worker's collective is aborted:
// every step is committed by all three in the one world they started in.
//
// Each forgery waits for its effect (the proposer's answered probe, the
// victim's refutation) before the next; training runs on until the last
// has taken effect, then stops at a step all three agree on.
//
// This guards the proposer's probe of gossip deaths and the workers'
// keeping their collectives for a verdict the proposer did not act on
// (TestGossipDeathIsProbed, TestGossipVerdictAloneKeepsTheWorld do the
// same from inside the processes).
func TestForgedGossipDeathKeepsTheWorld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const job, secret = "elastic-test", "elastic-test-secret"
	driverLog := &lineLog{}
	dm := membership.DefaultConfig()
	dm.LogRepeatWindow = time.Nanosecond
	// A probe timeout long enough that a live worker starved of CPU on a
	// loaded test machine still answers in time (as in sync/driver's tests).
	const probeTimeout = 3 * time.Second
	d, err := driver.Start(ctx, driver.Config{JobID: job, Secret: []byte(secret), MinWorkers: 3, ProbeTimeout: probeTimeout,
		Membership: dm, Logger: slog.New(driverLog)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })

	names := []string{"w0", "w1", "w2"}
	logs := map[string]*lineLog{}
	for _, name := range names {
		logs[name] = &lineLog{}
	}
	var (
		mu    stdsync.Mutex
		toys  = map[string]*elasticToy{}
		rec   = &recorder{}
		wg    stdsync.WaitGroup
		errs  = make(chan error, len(names))
		allIn = make(chan struct{})
		// stopAt is the step every worker stops before: set once the last
		// forgery took effect.
		stopAt atomic.Int64
	)
	stopAt.Store(math.MaxInt64)
	// A test that fails before the end stops the workers too.
	t.Cleanup(func() {
		stopAt.Store(math.MinInt64)
		cancel()
		wg.Wait()
	})
	for _, name := range names {
		wg.Go(func() {
			toy, err := joinElastic(t, ctx, d, func(c *WorkerConfig) {
				c.Logger = slog.New(logs[name]) // the worker's, its membership's and memberlist's
				c.Membership.LogRepeatWindow = time.Nanosecond
			})
			if err != nil {
				errs <- fmt.Errorf("%s: join: %w", name, err)
				return
			}
			defer toy.w.Close()
			mu.Lock()
			toys[name] = toy
			mu.Unlock()
			select {
			case <-allIn:
			case <-ctx.Done():
				errs <- fmt.Errorf("%s: no world of all the workers: %w", name, ctx.Err())
				return
			}
			stop := func(step int64) bool { return step >= stopAt.Load() }
			if err := toyLoop(ctx, toy.w.Session, name, toy.params, math.MaxInt64, rec, stop, func() {}); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		})
	}
	waitFor(t, d, func(e epoch.World) bool { return len(e.Members) == 3 })
	start := d.Current()
	waitCond(t, ctx, "every worker started", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(toys) == len(names)
	})
	close(allIn)

	// The forger: the victim is w1; every member's gossip port hears it.
	mu.Lock()
	victim := toys["w1"].w.m.Local()
	targets := []netip.AddrPort{netip.MustParseAddrPort(d.GossipAddr())}
	for _, toy := range toys {
		targets = append(targets, toy.w.m.Local().Addr)
	}
	mu.Unlock()
	key, err := gossipforge.GossipKey([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	vlog := logs["w1"]
	probed := func() int { return driverLog.count("blamed worker is alive", "worker="+victim.Name) }
	seen := func(kind string) int { return driverLog.count("membership: member "+kind, "node="+victim.Name) }
	inc := func(i int) uint32 { return 1<<20 + uint32(i)<<10 } // above every refutation before it
	for i, tc := range []struct {
		name    string
		msg     any
		state   gossipforge.State // a push/pull's, when msg is nil
		refutes string            // what the victim logs
		dies    bool              // the driver's gossip believes it dead, then alive
	}{
		{name: "udp dead", msg: gossipforge.Dead{Incarnation: inc(0), Node: victim.Name, From: "someone"}, refutes: "Refuting a dead message", dies: true},
		{name: "udp suspect", msg: gossipforge.Suspect{Incarnation: inc(1), Node: victim.Name, From: "someone"}, refutes: "Refuting a suspect message"},
		{name: "udp left", msg: gossipforge.Dead{Incarnation: inc(2), Node: victim.Name, From: victim.Name}, refutes: "Refuting a dead message", dies: true},
		{name: "tcp push/pull left", state: gossipforge.StateLeft, refutes: "Refuting a dead message", dies: true},
	} {
		refuted, failed, joined := vlog.count(tc.refutes), seen("failed"), seen("joined")
		for _, to := range targets {
			if tc.msg != nil {
				if err := gossipforge.SendMessage(to, key, tc.msg); err != nil {
					t.Fatal(err)
				}
				continue
			}
			stream, err := gossipforge.PushPull(key, false, []gossipforge.NodeState{{Name: victim.Name, Addr: victim.Addr.Addr().AsSlice(),
				Port: victim.Addr.Port(), Incarnation: inc(i), State: tc.state, Vsn: gossipforge.Versions}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := gossipforge.Exchange(ctx, to, stream, 5*time.Second); err != nil {
				t.Logf("%s: push/pull with %v: %v", tc.name, to, err)
			}
		}
		waitCond(t, ctx, tc.name+": the victim refutes it", func() bool { return vlog.count(tc.refutes) > refuted })
		if tc.dies {
			// The driver's protocol loop may see the death and probe (the
			// victim answers), or, when the refutation comes first, find
			// the Failed and Joined events coalesced into one Joined.
			waitCond(t, ctx, tc.name+": the driver's gossip reports the victim failed", func() bool { return seen("failed") > failed })
			waitCond(t, ctx, tc.name+": the driver's gossip reports the victim back", func() bool { return seen("joined") > joined })
		}
	}
	// Training goes on through the proposer's probe timeout after the last
	// forgery, with an allowance for the epoch it would propose: a probe
	// the victim did not answer would remove it within that window.
	quietUntil := time.Now().Add(probeTimeout + time.Second)
	waitCond(t, ctx, "the proposer's probe timeout after the last forgery", func() bool {
		if cur := d.Current(); cur.Number != start.Number {
			t.Fatalf("the driver proposed epoch %d (%d members) after the forgeries, want epoch %d still", cur.Number, len(cur.Members), start.Number)
		}
		return time.Now().After(quietUntil)
	})
	// (Counted now: once training stops, the workers leave.)
	if c := driverLog.count("removed from the next world"); c != 0 {
		t.Errorf("the driver removed %d workers", c)
	}

	// Stop a few steps ahead of the furthest worker: every one checks
	// stopAt before each step, and none is more than a step ahead of
	// another (each step is an allreduce of all three).
	rec.mu.Lock()
	var furthest int64
	for _, r := range rec.recs {
		furthest = max(furthest, r.step)
	}
	rec.mu.Unlock()
	stopAt.Store(furthest + 5)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	last := stopAt.Load() // each worker commits steps 1..stopAt
	n := agree(t, rec)
	for step := int64(1); step <= last; step++ {
		if n[step] != 3 {
			t.Errorf("step %d committed by %d workers, want 3", step, n[step])
		}
	}
	rec.mu.Lock()
	for _, r := range rec.recs {
		if r.epoch != start.Number {
			t.Errorf("%s committed step %d in epoch %d, want every step in epoch %d (the world before the forgeries)", r.worker, r.step, r.epoch, start.Number)
			break
		}
	}
	rec.mu.Unlock()
	t.Logf("%d steps in epoch %d while the forgeries were refuted; the proposer probed the victim %d times, and it answered", last, start.Number, probed())
}

// waitCond polls ok until it holds, failing the test when ctx ends first.
func waitCond(t *testing.T, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s: not by the test's deadline", what)
		}
	}
}
