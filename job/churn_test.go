package job_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorovod/gorovod/job"
	"github.com/gorovod/gorovod/sync/epoch"
)

// churnProfiles, when set, is a directory the churn tests write the
// driver's and the surviving worker's heap profiles to (after the warm-up
// and at the end: driver-warm, driver-churned, worker-warm,
// worker-churned), for `go tool pprof -top -diff_base`.
var churnProfiles = flag.String("churn.profiles", "", "write the churn tests' driver heap profiles to this `directory`")

// churnLog, when set, is a file the churn tests write everything they see
// to as it comes: the driver's log at debug level (its gossip's lines
// among them), the workers' stderr, and each world and notice, each line
// timestamped. The driver's newest churnLogLines lines that a failure shows
// begin long after a stall began; this file holds its start, and the
// workers' side of it.
var churnLog = flag.String("churn.log", "", "write the churn tests' driver log (debug level) and the workers' stderr to this `file`")

// churnWatch is the churn tests' Sink. It keeps only the newest world and
// the newest heap figure of the worker that is never killed: a sink that
// kept every event would itself grow with the churn it measures.
type churnWatch struct {
	survivor int // the launch index whose heap lines it keeps

	mu         sync.Mutex
	now        churnState
	heap       uint64 // the survivor's newest live heap
	notify     chan struct{}
	lastNotice string
	// failed says how a worker failed (exited with an error of its own):
	// the job goes on without it, at its MinWorkers, and the world the test
	// waits for never comes; the wait ends at once with this instead.
	failed string
	// lastError is the newest "trainer: ..." line a worker printed on its
	// stderr: why a worker that fails exits.
	lastError string
	dumping   bool     // keep the workers' stderr lines (their goroutine dumps)
	dump      []string // the lines kept
	log       []string // the driver's newest log lines (churnLogLines)
	file      *os.File // everything seen, as it comes (churnLog); nil when not asked for
}

// record writes a timestamped line to the churn log file, if there is one.
// c.mu must be held.
func (c *churnWatch) record(who, line string) {
	if c.file != nil {
		fmt.Fprintf(c.file, "%s %s %s\n", time.Now().UTC().Format("15:04:05.000000"), who, line)
	}
}

// churnLogLines is how many of the driver's log lines a churn test keeps,
// to show when it fails.
const churnLogLines = 200

// Write takes the driver's log lines (a slog handler's output).
func (c *churnWatch) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	line := strings.TrimRight(string(b), "\n")
	c.record("driver", line)
	if strings.Contains(line, " level=DEBUG ") {
		return len(b), nil // in the file only (churnLog)
	}
	c.log = append(c.log, line)
	if len(c.log) > churnLogLines {
		c.log = slices.Delete(c.log, 0, len(c.log)-churnLogLines)
	}
	return len(b), nil
}

// churnState is what the churn tests wait on.
type churnState struct {
	world     epoch.World
	heapEpoch uint64 // the world the survivor's newest heap figure was measured in
	steps     int    // steps the survivor committed since
	step      int64  // the survivor's newest committed step
}

// settled says the survivor measured its heap in the newest world (or a
// later one) and trained stepsPerWorld steps since.
func (s churnState) settled() bool {
	return s.heapEpoch >= s.world.Number && s.steps >= stepsPerWorld
}

func newChurnWatch() *churnWatch { return &churnWatch{notify: make(chan struct{}, 1)} }

func (c *churnWatch) Event(e job.Event) {
	c.mu.Lock()
	switch e := e.(type) {
	case job.WorldChanged:
		c.now.world = e.World
		c.record("world", fmt.Sprintf("%d %v joined %v left %v", e.World.Number, e.World.Members, e.Joined, e.Left))
	case job.Notice:
		c.lastNotice = e.Message
		c.record("notice", e.Message)
	case job.WorkerOutput:
		if c.dumping && e.Stream == "stderr" {
			c.dump = append(c.dump, fmt.Sprintf("[%d] %s", e.Worker, e.Line))
		}
		if e.Stream == "stderr" {
			c.record(fmt.Sprintf("worker-%d", e.Worker), string(e.Line))
			if bytes.HasPrefix(e.Line, []byte("trainer: ")) {
				c.lastError = fmt.Sprintf("[%d] %s", e.Worker, e.Line)
			}
		}
		var line struct {
			Step  int64  `json:"step"`
			Heap  uint64 `json:"heap"`
			Epoch uint64 `json:"epoch"`
		}
		if e.Worker != c.survivor || json.Unmarshal(e.Line, &line) != nil {
			c.mu.Unlock()
			return
		}
		switch {
		case line.Heap > 0:
			c.heap, c.now.heapEpoch, c.now.steps = line.Heap, line.Epoch, 0
		case line.Step > 0:
			c.now.steps++
			c.now.step = max(c.now.step, line.Step)
		}
	case job.WorkerStarted:
		c.record("event", fmt.Sprintf("%T %+v", e, e))
		c.mu.Unlock()
		return
	case job.WorkerExited:
		c.record("event", fmt.Sprintf("%T %+v", e, e))
		if e.State == job.Failed && c.failed == "" {
			c.failed = fmt.Sprintf("worker %d (%s) failed: %v; its last error line: %q", e.Worker.Index, e.Name, e.Err, c.lastError)
		}
	default:
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds.
func (c *churnWatch) waitFor(ctx context.Context, what string, cond func(churnState) bool) error {
	for {
		c.mu.Lock()
		ok := cond(c.now)
		now, notice, failed, dumping := c.now, c.lastNotice, c.failed, c.dumping
		c.mu.Unlock()
		if ok {
			return nil
		}
		if failed != "" && !dumping {
			return fmt.Errorf("waiting for %s: %s (world %d of %d)", what, failed, now.world.Number, len(now.world.Members))
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (world %d of %d; the survivor measured its heap in world %d, trained %d steps since, to step %d; last notice %q)",
				what, ctx.Err(), now.world.Number, len(now.world.Members), now.heapEpoch, now.steps, now.step, notice)
		}
	}
}

func (c *churnWatch) step() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.step
}

func (c *churnWatch) survivorHeap() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heap
}

// churnJob is a running job of `size` workers that changes its world over
// and over as a job under churn does: a worker is added (AddWorkers: a
// world of size+1), then one leaves (SIGTERM, job.LeaveSignal: a world of
// size without it). Worker 0 never leaves. Its floor is one below size, so
// that workers that left are not replaced (the floor is tested elsewhere).
//
// The workers leave gracefully rather than being killed: a worker killed
// with SIGKILL makes the survivors' collective fail, and a survivor whose
// neighbour aborted first is blamed for that failure too; blamed in three
// worlds within two minutes (epoch.ProposerConfig.BlameLimit and
// BlameWindow), it is removed as stuck, which a kill every second does to
// the survivor this test follows.
type churnJob struct {
	t     testing.TB
	j     *job.Job
	watch *churnWatch
	size  int
}

func startChurnJob(t testing.TB, ctx context.Context, size int) *churnJob {
	t.Helper()
	watch := newChurnWatch()
	level := slog.LevelInfo
	if *churnLog != "" {
		f, err := os.Create(*churnLog)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			watch.mu.Lock()
			defer watch.mu.Unlock()
			watch.file.Close()
			watch.file = nil
		})
		watch.file, level = f, slog.LevelDebug
	}
	cfg := job.Config{Argv: []string{os.Args[0]}, Workers: size, MinWorkers: size - 1, ReplaceLost: true,
		KeepExitedWorkers: churnKeepExited,
		Env: []string{envSteps + "=1000000000", envStepTime + "=1ms", envHeap + "=1",
			envHeapProfiles + "=" + *churnProfiles},
		Sinks: []job.Sink{watch}, Logger: slog.New(slog.NewTextHandler(watch, &slog.HandlerOptions{Level: level}))}
	if *churnLog != "" {
		// The workers log to their stderr (GOROVOD_LOG_LEVEL), which the
		// watch writes to the file.
		cfg.Env = append(cfg.Env, "GOROVOD_LOG_LEVEL=debug")
	}
	j, err := job.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &churnJob{t: t, j: j, watch: watch, size: size}
	if err := watch.waitFor(ctx, "the first full world", func(s churnState) bool { return len(s.world.Members) == size }); err != nil {
		t.Fatal(err)
	}
	return c
}

// churnKeepExited is the churn job's Config.KeepExitedWorkers: fewer than
// the workers its warm-up alone starts (about one per two world changes),
// so that the measurements see a job past the bound, as a job under churn
// for weeks is past the default.
const churnKeepExited = 32

// cycleLimit is the longest a churn cycle may take.
const cycleLimit = 3 * time.Minute

// stepsPerWorld is how many steps the survivor trains in each world of a
// cycle, so that what the job keeps of the steps of past worlds shows.
const stepsPerWorld = 40

// cycle adds a worker and waits for a world with it, then has a member
// other than worker 0 leave and waits for a world without it, the survivor
// having measured its heap and trained stepsPerWorld steps in each; it
// returns the world changes it took.
func (c *churnJob) cycle(ctx context.Context) (int, error) {
	// A cycle takes about a second (far more with every allocation
	// profiled); one that has not ended after cycleLimit is a job that
	// stopped changing its world, which the run reports, with the driver's
	// log, rather than wait out its whole limit.
	ctx, cancel := context.WithTimeout(ctx, cycleLimit)
	defer cancel()
	start := c.j.World().Number
	if err := c.j.AddWorkers(ctx, 1); err != nil {
		return 0, err
	}
	var now uint64
	if err := c.watch.waitFor(ctx, "a world with the added worker", func(s churnState) bool {
		now = s.world.Number
		return len(s.world.Members) == c.size+1 && s.settled()
	}); err != nil {
		return 0, err
	}
	world := c.j.World()
	var leaver job.WorkerRecord
	for _, w := range c.j.Workers() {
		if w.Index != 0 && w.State == job.Running && w.Name != "" && world.Rank(w.Name) >= 0 {
			leaver = w
			break
		}
	}
	if leaver.PID == 0 {
		return int(now - start), fmt.Errorf("no worker to leave in world %d (%+v)", world.Number, c.j.Workers())
	}
	if err := syscall.Kill(leaver.PID, job.LeaveSignal); err != nil {
		return int(now - start), err
	}
	err := c.watch.waitFor(ctx, fmt.Sprintf("a world without worker %d", leaver.Index), func(s churnState) bool {
		now = s.world.Number
		return len(s.world.Members) == c.size && s.world.Rank(leaver.Name) < 0 && s.settled()
	})
	return int(now - start), err
}

// churn cycles until at least changes world changes have been made, and
// returns how many were.
func (c *churnJob) churn(ctx context.Context, changes int) (int, error) {
	made := 0
	for made < changes {
		n, err := c.cycle(ctx)
		made += n
		if err != nil {
			return made, err
		}
	}
	return made, nil
}

// fail reports err with the goroutines of every worker still running: they
// are sent SIGQUIT (a Go program prints its goroutines and exits) and
// their stderr lines are logged.
func (c *churnJob) fail(err error) {
	c.t.Helper()
	c.watch.mu.Lock()
	c.watch.dumping = true
	c.watch.mu.Unlock()
	var pids []int
	for _, w := range c.j.Workers() {
		if w.State == job.Running {
			pids = append(pids, w.PID)
			_ = syscall.Kill(w.PID, syscall.SIGQUIT)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = c.watch.waitFor(ctx, "the workers' goroutine dumps", func(churnState) bool {
		running := 0
		for _, w := range c.j.Workers() {
			if w.State == job.Running {
				running++
			}
		}
		return running == 0
	})
	c.watch.mu.Lock()
	dump, log := strings.Join(c.watch.dump, "\n"), strings.Join(c.watch.log, "\n")
	c.watch.mu.Unlock()
	c.t.Fatalf("%v\nthe driver's newest log lines:\n%s\nthe workers %v (SIGQUIT):\n%s", err, log, pids, dump)
}

func (c *churnJob) stop(cancel context.CancelFunc) {
	cancel()
	_, _ = c.j.Wait()
}

// driverHeap is the live heap of this process (the job's driver runs in
// it) after collections, and its heap profile when profiles are asked for.
func driverHeap(t testing.TB) (uint64, []byte) {
	t.Helper()
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if *churnProfiles == "" {
		return m.HeapAlloc, nil
	}
	var b bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&b, 0); err != nil {
		t.Fatal(err)
	}
	return m.HeapAlloc, b.Bytes()
}

// heapSamples is how many cycles a churn run samples the live heaps over,
// after its warm-up and at its end: it keeps the least of each, as the
// heap at any moment also holds what is in flight (step statistics queued
// for the engine, output lines, a process being started).
const heapSamples = 5

// sampleHeaps runs heapSamples cycles, measuring the driver's and the
// survivor's live heaps after each; it returns the least of each (writing
// the driver's profile at its least as name) and the world changes made.
func (c *churnJob) sampleHeaps(ctx context.Context, name string) (driver, worker uint64, changes int, err error) {
	driver, worker = math.MaxUint64, math.MaxUint64
	var profile []byte
	for range heapSamples {
		n, err := c.cycle(ctx)
		changes += n
		if err != nil {
			return 0, 0, changes, err
		}
		d, p := driverHeap(c.t)
		if d < driver {
			driver, profile = d, p
		}
		worker = min(worker, c.watch.survivorHeap())
	}
	if dir := *churnProfiles; dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name+".pb.gz"), profile, 0o644); err != nil {
			return 0, 0, changes, err
		}
		// The survivor's newest profile (not necessarily at its least).
		worker, err := os.ReadFile(filepath.Join(dir, "heap-0.pb.gz"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, strings.Replace(name, "driver", "worker", 1)+".pb.gz"), worker, 0o644)
		}
		if err != nil {
			return 0, 0, changes, err
		}
	}
	return driver, worker, changes, nil
}

// churnMemory is what a churn run measured: the live heap of the driver
// and of the worker that was never killed, after the warm-up and after the
// world changes.
type churnMemory struct {
	changes                   int
	driverBefore, driverAfter uint64
	workerBefore, workerAfter uint64
	// rssBefore and rssAfter are this process's resident set (the driver
	// and the test around it), for comparison with `gorovod run`'s.
	rssBefore, rssAfter uint64
}

func (m churnMemory) perChange(before, after uint64) float64 {
	return (float64(after) - float64(before)) / float64(m.changes)
}

func (m churnMemory) String() string {
	return fmt.Sprintf("%d world changes: driver live heap %s -> %s (%+.0f B per change), surviving worker %s -> %s (%+.0f B per change)",
		m.changes, kib(m.driverBefore), kib(m.driverAfter), m.perChange(m.driverBefore, m.driverAfter),
		kib(m.workerBefore), kib(m.workerAfter), m.perChange(m.workerBefore, m.workerAfter))
}

// residentSet is this process's VmRSS in bytes.
func residentSet(t testing.TB) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

func kib(b uint64) string { return strconv.FormatFloat(float64(b)/1024, 'f', 0, 64) + " KiB" }

// warmUpSteps is how long a churn run trains, changing worlds, before it
// measures: twice the steps the autoscaling engine keeps of a job
// (heuristics.maxStepsKept, 4096, as many as a job that never changes its
// world keeps), so that the steps of past worlds fill them however many
// steps a change costs.
const warmUpSteps = 2 * 4096

// measureChurn runs a job of 3 workers (churnJob), makes at least warmup
// world changes and warmUpSteps steps, then measures the driver's and the
// survivor's live heaps (sampleHeaps), makes at least changes more and
// measures them again; every, when positive, has it also measure and log
// them every that many changes on the way.
func measureChurn(t testing.TB, warmup, changes, every int, limit time.Duration) churnMemory {
	t.Helper()
	if *churnProfiles != "" {
		runtime.MemProfileRate = 64 // every allocation shows in the profiles' difference
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	c := startChurnJob(t, ctx, 3)
	defer c.stop(cancel)
	for made := 0; made < warmup || c.watch.step() < warmUpSteps; {
		n, err := c.cycle(ctx)
		if err != nil {
			c.fail(fmt.Errorf("warm-up: %w", err))
		}
		made += n
	}
	var m churnMemory
	var err error
	if m.driverBefore, m.workerBefore, _, err = c.sampleHeaps(ctx, "driver-warm"); err != nil {
		c.fail(fmt.Errorf("warm-up: %w", err))
	}
	m.rssBefore = residentSet(t)
	for m.changes < changes {
		stretch := changes - m.changes
		if every > 0 {
			stretch = min(stretch, every)
		}
		n, err := c.churn(ctx, stretch)
		m.changes += n
		if err != nil {
			c.fail(fmt.Errorf("after %d world changes: %w", m.changes, err))
		}
		if m.changes >= changes {
			break
		}
		driver, worker, more, err := c.sampleHeaps(ctx, fmt.Sprintf("driver-%d", m.changes))
		m.changes += more
		if err != nil {
			c.fail(fmt.Errorf("after %d world changes: %w", m.changes, err))
		}
		t.Logf("after %d world changes: driver live heap %s, surviving worker %s, resident set %s",
			m.changes, kib(driver), kib(worker), kib(residentSet(t)))
	}
	var more int
	m.driverAfter, m.workerAfter, more, err = c.sampleHeaps(ctx, "driver-churned")
	m.changes += more
	if err != nil {
		c.fail(fmt.Errorf("after %d world changes: %w", m.changes, err))
	}
	m.rssAfter = residentSet(t)
	return m
}

// churnPerChangeLimit is the most the driver's or a surviving worker's live
// heap may grow per world change. The driver's and the workers' state
// belongs to the current world and bounded windows of recent ones (worlds,
// steps, decisions, records of exited workers); the limit is above the
// noise of 30 changes' samples on a loaded machine.
const churnPerChangeLimit = 4 << 10

// A job whose world changes over and over keeps its memory: after 30 world
// changes (15 workers added, 15 leaving), the
// driver's and the surviving worker's live heaps have grown by less than
// churnPerChangeLimit per change.
func TestMemoryDoesNotGrowWithChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills real worker processes; skipped with -short")
	}
	// The limit only guards against a hang: under CI's full -race suite
	// (the cmd/gorovod tests beside it) the run once needed more than
	// 90 s, its worlds still changing every half second at the deadline.
	m := measureChurn(t, 10, 30, 0, 4*time.Minute)
	t.Log(m)
	for _, p := range []struct {
		who           string
		before, after uint64
	}{{"the driver", m.driverBefore, m.driverAfter}, {"the surviving worker", m.workerBefore, m.workerAfter}} {
		if per := m.perChange(p.before, p.after); per > churnPerChangeLimit {
			t.Errorf("%s's live heap grew by %.0f B per world change, more than %d", p.who, per, churnPerChangeLimit)
		}
	}
}

// TestSoakChurn is the long run of TestMemoryDoesNotGrowWithChurn, for the
// figures in docs/multihost.md: GOROVOD_SOAK=1 runs it, GOROVOD_SOAK_CHANGES
// world changes after the warm-up (default 1000), measuring also every
// GOROVOD_SOAK_SAMPLE_EVERY changes when set.
func TestSoakChurn(t *testing.T) {
	if os.Getenv("GOROVOD_SOAK") != "1" {
		t.Skip("a soak test: GOROVOD_SOAK=1 runs it")
	}
	changes := 1000
	if s := os.Getenv("GOROVOD_SOAK_CHANGES"); s != "" {
		var err error
		if changes, err = strconv.Atoi(s); err != nil || changes < 1 {
			t.Fatalf("GOROVOD_SOAK_CHANGES=%q: want a positive count", s)
		}
	}
	every := 0
	if s := os.Getenv("GOROVOD_SOAK_SAMPLE_EVERY"); s != "" {
		var err error
		if every, err = strconv.Atoi(s); err != nil || every < 0 {
			t.Fatalf("GOROVOD_SOAK_SAMPLE_EVERY=%q: want a count of world changes", s)
		}
	}
	m := measureChurn(t, 10, changes, every, 10*time.Hour)
	t.Logf("%v; resident set %s -> %s", m, kib(m.rssBefore), kib(m.rssAfter))
}
