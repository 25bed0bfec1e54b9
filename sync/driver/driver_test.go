package driver_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// These tests run the protocol's loops over real gossip (membership on
// loopback): a Driver and workers that are only their Agent, no collectives.

const jobID, secret = "driver-test", "driver-test-secret"

// gossipConfig is the membership configuration of these tests' driver and
// workers: the defaults with failure detection slowed for a test machine
// under load. With the defaults (a 100 ms ack wait, then 0.4 s of suspicion
// with no confirmations) a -race test process starved of CPU for half a
// second is declared dead while it is alive, and the driver rightly takes
// it out of the next world; these tests are about what the driver does
// with failure reports and probes, not about gossip's detection, so they
// give a live member 4 s to refute a suspicion. A dead worker is still
// found at once: the proposer's probe and the sweep see its gossip port
// refuse connections.
func gossipConfig() membership.Config {
	mc := membership.DefaultConfig()
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = time.Second, 500*time.Millisecond, 4
	return mc
}

// probeTimeout is the driver's wait for a probed worker's answer in these
// tests (Config.ProbeTimeout), and that of a worker that takes over
// proposing (AgentConfig.ProbeTimeout), for the same reason: a live worker
// starved for the default 500 ms is left out of the next world as
// unanswered. A dead worker's probe still fails at once (its connection is
// refused).
const probeTimeout = 3 * time.Second

// records keeps the log records at Warn and above that are the protocol
// loop's own (not memberlist's, not the membership layer's), and every
// record at Info and above (memberlist's and the membership layer's too,
// and the membership layer's member events at Debug) for a failed test to
// show why: newRecords logs them when the test fails.
type records struct {
	mu    stdsync.Mutex
	warn  []string
	all   []string
	start time.Time
}

// newRecords returns a handler whose records are logged if t fails, so a
// failure names its cause (why a member was removed, a probe unanswered,
// gossip declaring a live worker dead).
func newRecords(t *testing.T) *records {
	t.Helper()
	return newRecordsOf(t, "the driver")
}

// newRecordsOf is newRecords for the log of who.
func newRecordsOf(t *testing.T, who string) *records {
	t.Helper()
	r := &records{start: time.Now()}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's log (seconds since it began):\n%s", who, strings.Join(r.lines(), "\n"))
		}
	})
	return r
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs(as []slog.Attr) slog.Handler {
	if r.start.IsZero() {
		return r // no log kept for a failure (a records made without newRecords)
	}
	return &recordsWith{r: r, attrs: as}
}
func (r *records) WithGroup(string) slog.Handler { return r }
func (r *records) Handle(ctx context.Context, rec slog.Record) error {
	return r.handle(ctx, rec, nil)
}

func (r *records) handle(_ context.Context, rec slog.Record, with []slog.Attr) error {
	var attrs []string
	memberlist := false
	rec.Attrs(func(a slog.Attr) bool {
		memberlist = memberlist || a.Key == "component"
		attrs = append(attrs, a.String())
		return true
	})
	for _, a := range with {
		attrs = append(attrs, a.String())
	}
	line := rec.Message + " " + strings.Join(attrs, " ")
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.start.IsZero() && (rec.Level >= slog.LevelInfo || strings.HasPrefix(rec.Message, "membership: member ")) {
		r.all = append(r.all, fmt.Sprintf("%7.3f %s %s", rec.Time.Sub(r.start).Seconds(), rec.Level, line))
	}
	if rec.Level >= slog.LevelWarn && !strings.HasPrefix(rec.Message, "membership:") && !memberlist {
		r.warn = append(r.warn, line)
	}
	return nil
}

// recordsWith is records with attributes (the membership layer's member
// name) added to each record.
type recordsWith struct {
	r     *records
	attrs []slog.Attr
}

func (w *recordsWith) Enabled(context.Context, slog.Level) bool { return true }
func (w *recordsWith) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordsWith{r: w.r, attrs: append(slices.Clip(w.attrs), as...)}
}
func (w *recordsWith) WithGroup(string) slog.Handler { return w }
func (w *recordsWith) Handle(ctx context.Context, rec slog.Record) error {
	return w.r.handle(ctx, rec, w.attrs)
}

func (r *records) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

func (r *records) reset() {
	r.mu.Lock()
	r.warn = nil
	r.mu.Unlock()
}

func (r *records) warnings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.warn)
}

// agent is a worker reduced to its protocol side: it records the epochs it
// adopts.
type agent struct {
	name string
	m    *membership.Member
	a    *driver.Agent
	mu   stdsync.Mutex
	seen []epoch.World
	news chan struct{}
}

func startAgent(t *testing.T, ctx context.Context, seed string, min int) *agent {
	t.Helper()
	return startAgentLogged(t, ctx, seed, min, nil)
}

func startAgentLogged(t *testing.T, ctx context.Context, seed string, min int, log *slog.Logger) *agent {
	t.Helper()
	return startAgentWith(t, ctx, seed, driver.AgentConfig{MinWorkers: min, Logger: log})
}

// joinSilent joins a ready worker that no agent serves: alive to gossip,
// it answers no probe and sends no report.
func joinSilent(t *testing.T, ctx context.Context, seed string) *membership.Member {
	t.Helper()
	mc := gossipConfig()
	mc.Secret, mc.Seeds = []byte(secret), []string{seed}
	silent, err := membership.Join(ctx, mc, membership.Meta{JobID: jobID, Role: membership.RoleWorker, CollectiveAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Shutdown() })
	if err := silent.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateReady }); err != nil {
		t.Fatal(err)
	}
	return silent
}

// startAgentWith starts a worker's agent configured by cfg (its OnAdopt is
// the harness's).
func startAgentWith(t *testing.T, ctx context.Context, seed string, cfg driver.AgentConfig) *agent {
	t.Helper()
	mc := gossipConfig()
	mc.Secret, mc.Seeds = []byte(secret), []string{seed}
	m, err := membership.Join(ctx, mc, membership.Meta{JobID: jobID, Role: membership.RoleWorker, CollectiveAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ag := &agent{name: m.Name(), m: m, news: make(chan struct{}, 1)}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = probeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(newRecordsOf(t, "agent "+ag.name))
	}
	cfg.OnAdopt = func(w epoch.World) {
		ag.mu.Lock()
		ag.seen = append(ag.seen, w)
		ag.mu.Unlock()
		select {
		case ag.news <- struct{}{}:
		default:
		}
	}
	ag.a = driver.StartAgent(m, cfg)
	t.Cleanup(func() {
		_ = m.Shutdown()
		ag.a.Stop()
	})
	if err := m.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateReady }); err != nil {
		t.Fatal(err)
	}
	return ag
}

func (ag *agent) latest() epoch.World {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if len(ag.seen) == 0 {
		return epoch.World{}
	}
	return ag.seen[len(ag.seen)-1]
}

// await waits until the newest epoch the agent adopted satisfies ok.
func (ag *agent) await(t *testing.T, what string, ok func(epoch.World) bool) epoch.World {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		if w := ag.latest(); ok(w) {
			return w
		}
		select {
		case <-ag.news:
		case <-deadline:
			t.Fatalf("%s: no epoch where %s; newest %v", ag.name, what, ag.latest())
		}
	}
}

func (ag *agent) checkIncreasing(t *testing.T) {
	t.Helper()
	ag.mu.Lock()
	defer ag.mu.Unlock()
	for i := 1; i < len(ag.seen); i++ {
		if ag.seen[i].Number <= ag.seen[i-1].Number {
			t.Errorf("%s adopted epoch %d after %d", ag.name, ag.seen[i].Number, ag.seen[i-1].Number)
		}
	}
}

func names(w epoch.World) []string {
	out := make([]string, len(w.Members))
	for i, m := range w.Members {
		out[i] = m.Name
	}
	return out
}

func startDriver(t *testing.T, ctx context.Context, min int, log *slog.Logger) *driver.Driver {
	t.Helper()
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: min,
		ProbeTimeout: probeTimeout, Membership: gossipConfig(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// The driver's epochs reach every worker; a worker blamed for a failure that
// is alive stays (the world is formed again), one whose process is gone is
// removed; training ends with every member done, and a normal departure logs
// no warning.
func TestDriverOverGossip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := newRecords(t)
	d := startDriver(t, ctx, 2, slog.New(log))
	var ags []*agent
	for range 3 {
		ags = append(ags, startAgent(t, ctx, d.GossipAddr(), 2))
	}
	all := func(w epoch.World) bool { return len(w.Members) == 3 }
	var w epoch.World
	for _, ag := range ags {
		w = ag.await(t, "all three are members", all)
	}
	if got := d.Current(); !got.Equal(w) {
		t.Fatalf("the driver's epoch is %v, the workers' %v", got, w)
	}
	if ws := d.Workers(); len(ws) != 3 {
		t.Fatalf("the driver knows %d workers: %+v", len(ws), ws)
	}

	// Blame a live worker: it answers the probe and stays.
	ags[0].a.ReportFailure(w.Number, ags[1].name, fmt.Errorf("link reset"))
	renewed := ags[0].await(t, "a newer world", func(x epoch.World) bool { return x.Number > w.Number })
	if !slices.Equal(names(renewed), names(w)) {
		t.Fatalf("after blaming a live worker the world is %v, want %v again", names(renewed), names(w))
	}

	// A worker whose process is gone (no goodbye): removed.
	ags[2].m.Shutdown()
	ags[2].a.Stop()
	ags[0].a.ReportFailure(renewed.Number, ags[2].name, fmt.Errorf("link reset"))
	two := ags[0].await(t, "the dead worker gone", func(x epoch.World) bool { return len(x.Members) == 2 })
	ags[1].await(t, "the dead worker gone", func(x epoch.World) bool { return x.Number == two.Number })
	if two.Rank(ags[2].name) >= 0 {
		t.Fatalf("the world %v still has the dead worker", names(two))
	}

	// The end of training: every member reports it, then leaves. From here
	// on, nothing is worth a warning.
	waitUntil(t, "the dead worker gone from the driver's view", func() bool { return len(d.Workers()) == 2 })
	log.reset()
	for _, ag := range ags[:2] {
		if err := ag.a.Finish(ctx, two.Number); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-d.Finished():
	case <-ctx.Done():
		t.Fatal("the driver never learned that training finished")
	}
	waitUntil(t, "no member unfinished", func() bool { return len(d.Unfinished()) == 0 })
	for _, ag := range ags[:2] {
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		_ = ag.m.Leave(lctx)
		lcancel()
		ag.a.Stop()
	}
	waitUntil(t, "the workers gone from the driver's view", func() bool { return len(d.Workers()) == 0 })
	// Two re-announcement periods: nothing is sent to the departed workers,
	// so nothing fails.
	time.Sleep(2500 * time.Millisecond)
	if warn := log.warnings(); len(warn) > 0 {
		t.Fatalf("the driver warned during a normal run:\n%s", strings.Join(warn, "\n"))
	}
	for _, ag := range ags {
		ag.checkIncreasing(t)
	}
}

// Without a driver, the oldest ready worker takes over after the grace and
// continues the numbering; a worker arriving later is admitted by it.
func TestAgentTakesOverFromDeadDriver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), Membership: gossipConfig()})
	if err != nil {
		t.Fatal(err)
	}
	var ags []*agent
	for range 2 {
		ags = append(ags, startAgent(t, ctx, d.GossipAddr(), 1))
	}
	w := ags[1].await(t, "both are members", func(w epoch.World) bool { return len(w.Members) == 2 })
	seed := ags[0].m.Local().Addr.String()
	d.Close()
	late := startAgent(t, ctx, seed, 1)
	three := late.await(t, "the newcomer admitted by the worker that took over", func(x epoch.World) bool {
		return len(x.Members) == 3
	})
	if three.Number <= w.Number {
		t.Fatalf("the worker that took over numbered %d after %d", three.Number, w.Number)
	}
	for _, ag := range ags {
		ag.await(t, "the newcomer admitted", func(x epoch.World) bool { return x.Number >= three.Number })
		ag.checkIncreasing(t)
	}
}

// decisions keeps the protocol decisions an agent logs (its messages with
// their attributes), for a test to wait on one.
type decisions struct {
	mu   stdsync.Mutex
	said []string
}

func (d *decisions) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (d *decisions) WithAttrs([]slog.Attr) slog.Handler           { return d }
func (d *decisions) WithGroup(string) slog.Handler                { return d }
func (d *decisions) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	d.mu.Lock()
	d.said = append(d.said, line)
	d.mu.Unlock()
	return nil
}

func (d *decisions) lines() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.said)
}

func (d *decisions) saidAny(pred func(string) bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.said, pred)
}

// The job's driver is out of view while the world is still forming (a
// starved, frozen or dead driver): the lone ready worker takes over
// proposing, but with the job's minimum of 3 (what gorovod run hands every
// worker as GOROVOD_MIN_WORKERS) it forms no world of one: it waits, and
// proposes the first world once three workers are ready.
func TestAgentTakeoverKeepsTheMinimum(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := startDriver(t, ctx, 3, nil)
	said := &decisions{}
	first := startAgentLogged(t, ctx, d.GossipAddr(), 3, slog.New(said))
	seed := first.m.Local().Addr.String()
	d.Close()
	proposed := func(l string) bool { return strings.HasPrefix(l, "proposed") }
	waitUntil(t, "the lone worker to take over and decide", func() bool {
		return said.saidAny(func(l string) bool { return strings.HasPrefix(l, "no driver:") }) &&
			said.saidAny(func(l string) bool { return proposed(l) || strings.HasPrefix(l, "waiting for enough workers") })
	})
	if w := first.latest(); w.Number != 0 || said.saidAny(proposed) {
		t.Fatalf("a lone worker that took over formed %v, below the job's minimum of 3", w)
	}
	if !said.saidAny(func(l string) bool {
		return strings.HasPrefix(l, "waiting for enough workers") && strings.Contains(l, "min=3")
	}) {
		t.Fatalf("the worker that took over did not wait for the minimum of 3: %q", said.lines())
	}
	second := startAgent(t, ctx, seed, 3)
	third := startAgent(t, ctx, seed, 3)
	for _, ag := range []*agent{first, second, third} {
		w := ag.await(t, "the three in one world", func(w epoch.World) bool { return len(w.Members) == 3 })
		if w.Number != 1 {
			t.Fatalf("%s: the first world is %v, want number 1 with all three", ag.name, w)
		}
	}
}

// TestAgentTakeoverFirstWorld: two workers of a job of four (GOROVOD_NP)
// lose the driver before any world reached them, as on the far side of a
// cut while the first world forms. They may not form a first world of their
// own: the oldest takes over after the takeover and minority graces, says
// it lacks the first world's quorum and proposes nothing; a third worker
// of the four makes a majority, and the three form it.
func TestAgentTakeoverFirstWorld(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d := startDriver(t, ctx, 4, nil)
	said := &decisions{}
	cfg := driver.AgentConfig{MinWorkers: 2, FirstWorld: 4, Logger: slog.New(said)}
	first := startAgentWith(t, ctx, d.GossipAddr(), cfg)
	second := startAgentWith(t, ctx, d.GossipAddr(), cfg)
	seed := first.m.Local().Addr.String()
	waitUntil(t, "the driver to see both workers", func() bool { return len(d.Workers()) == 2 })
	d.Close()
	noQuorum := func(l string) bool { return strings.HasPrefix(l, "no quorum for the job's first world") }
	deadline := time.Now().Add(epoch.DefaultTakeoverGrace + epoch.DefaultMinorityGrace + 20*time.Second)
	waitUntilBy(t, "the pair to take over and lack the first world's quorum", deadline, func() bool { return said.saidAny(noQuorum) })
	for _, ag := range []*agent{first, second} {
		if w := ag.latest(); w.Number != 0 || said.saidAny(func(l string) bool { return strings.HasPrefix(l, "proposed") }) {
			t.Fatalf("%s: the pair formed %v, 2 of the job's 4 first workers", ag.name, w)
		}
	}
	third := startAgentWith(t, ctx, seed, cfg)
	for _, ag := range []*agent{first, second, third} {
		if w := ag.await(t, "the three in one world", func(w epoch.World) bool { return len(w.Members) == 3 }); w.Number != 1 {
			t.Fatalf("%s: the first world is %v, want number 1 with all three", ag.name, w)
		}
	}
}

// TestAgentTakeoverWaitsItsProbeTimeout: a worker that took over proposing
// (the driver gone) waits its AgentConfig.ProbeTimeout for the answer of a
// worker blamed for a failure, as the driver waits its own
// (TestDriverWaitsItsProbeTimeout), not the proposer's default 500 ms: a
// silent member (its gossip alive, no protocol loop to answer) blamed after
// the takeover leaves the next world, as unanswered, no sooner than that,
// and the takeover's log line says the timeout.
func TestAgentTakeoverWaitsItsProbeTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Six times the default: a proposer that kept the default would remove
	// the silent worker long before it.
	const wait = 3 * time.Second
	d := startDriver(t, ctx, 2, nil)
	said := &decisions{}
	cfg := driver.AgentConfig{MinWorkers: 2, ProbeTimeout: wait, Logger: slog.New(said)}
	first := startAgentWith(t, ctx, d.GossipAddr(), cfg)
	second := startAgentWith(t, ctx, d.GossipAddr(), cfg)
	// The silent worker, younger than both: a member that no agent serves.
	silent := joinSilent(t, ctx, d.GossipAddr())
	first.await(t, "all three are members", func(w epoch.World) bool { return len(w.Members) == 3 })
	d.Close()
	tookOver := func(l string) bool { return strings.HasPrefix(l, "no driver:") }
	// The takeover's log line comes once its sync is over (the silent
	// worker is asked for its epoch too, and never answers: SyncTimeout).
	deadline := time.Now().Add(epoch.DefaultTakeoverGrace + epoch.DefaultProposerConfig().SyncTimeout + 20*time.Second)
	waitUntilBy(t, "a worker to take over", deadline, func() bool { return said.saidAny(tookOver) })
	if !said.saidAny(func(l string) bool { return tookOver(l) && strings.Contains(l, "probe_timeout="+wait.String()) }) {
		t.Fatalf("the takeover does not say the worker's probe timeout of %v: %q", wait, said.lines())
	}
	w := second.await(t, "the world taken over, with the silent worker", func(w epoch.World) bool { return w.Rank(silent.Name()) >= 0 })
	start := time.Now()
	second.a.ReportFailure(w.Number, silent.Name(), fmt.Errorf("no data from it"))
	next := second.await(t, "the silent worker gone", func(x epoch.World) bool { return x.Number > w.Number && x.Rank(silent.Name()) < 0 })
	took := time.Since(start)
	if took < wait {
		t.Fatalf("the silent worker was left out %v after it was blamed (world %d %v), before the probe timeout of %v of the worker that took over",
			took, next.Number, names(next), wait)
	}
	if !said.saidAny(func(l string) bool {
		return strings.HasPrefix(l, "removed from the next world") && strings.Contains(l, "worker="+silent.Name()) &&
			strings.Contains(l, "why="+epoch.ReasonUnanswered.String())
	}) {
		t.Fatalf("no log line names %s removed as %s: %q", silent.Name(), epoch.ReasonUnanswered, said.lines())
	}
	t.Logf("the silent worker was left out %v after it was blamed (probe timeout %v)", took, wait)
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	waitUntilBy(t, what, time.Now().Add(20*time.Second), ok)
}

func waitUntilBy(t *testing.T, what string, deadline time.Time, ok func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func TestElectProposer(t *testing.T) {
	node := func(name string, role membership.Role, state membership.State, started int64) membership.Node {
		return membership.Node{Name: name, Meta: membership.Meta{Role: role, State: state, StartedAt: started}}
	}
	for _, tc := range []struct {
		name  string
		nodes []membership.Node
		want  string
	}{
		{"the driver while one is alive", []membership.Node{
			node("w1", membership.RoleWorker, membership.StateReady, 1), node("d", membership.RoleDriver, membership.StateReady, 5)}, "d"},
		{"the newest of two drivers: one that took the job back supersedes the one it replaced", []membership.Node{
			node("old", membership.RoleDriver, membership.StateReady, 1), node("w", membership.RoleWorker, membership.StateReady, 0),
			node("new", membership.RoleDriver, membership.StateReady, 9)}, "new"},
		{"else the oldest ready worker", []membership.Node{
			node("w2", membership.RoleWorker, membership.StateReady, 3), node("w0", membership.RoleWorker, membership.StateJoining, 1),
			node("w1", membership.RoleWorker, membership.StateReady, 2), node("w3", membership.RoleWorker, membership.StateLeaving, 0)}, "w1"},
		{"ties broken by name", []membership.Node{
			node("b", membership.RoleWorker, membership.StateReady, 1), node("a", membership.RoleWorker, membership.StateReady, 1)}, "a"},
		{"nobody", []membership.Node{node("w0", membership.RoleWorker, membership.StateJoining, 1)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := driver.ElectProposer(tc.nodes); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
