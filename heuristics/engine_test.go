package heuristics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/straggler"
)

// engWait bounds every wait for the engine to do something.
const engWait = 5 * time.Second

// engFake is the engine's cluster and provisioner at once. The test decides
// when started workers join (join) and when removed ones leave (leave, drop),
// each producing the next world epoch through Engine.OnWorld.
type engFake struct {
	mu        sync.Mutex
	e         *Engine
	epoch     uint64
	members   []string
	joining   []string // started, not yet in a world
	known     []WorkerInfo
	removed   []string
	removedAt []uint64 // the world epoch the test had announced at each Remove
	starts    []int
	stops     []WorkerInfo
	stoppedAt []uint64
	startErr  error

	startCh  chan int
	removeCh chan string
	stopCh   chan WorkerInfo
}

func newEngFake(n int) *engFake {
	f := &engFake{startCh: make(chan int, 100), removeCh: make(chan string, 100), stopCh: make(chan WorkerInfo, 100)}
	for range n {
		f.members = append(f.members, f.add())
	}
	return f
}

// add makes up a new worker, w0, w1, ..., with a host and a PID.
func (f *engFake) add() string {
	i := len(f.known)
	name := fmt.Sprintf("w%d", i)
	f.known = append(f.known, WorkerInfo{Name: name, Host: "host-" + name, PID: 1000 + i})
	return name
}

func (f *engFake) info(name string) WorkerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.known {
		if w.Name == name {
			return w
		}
	}
	return WorkerInfo{}
}

// announce makes members the next world epoch (members nil: keep them).
func (f *engFake) announce(at time.Time, members []string) uint64 {
	f.mu.Lock()
	if members != nil {
		f.members = members
	}
	f.epoch++
	w := WorldChange{Epoch: f.epoch, Members: slices.Clone(f.members), At: at}
	f.mu.Unlock()
	f.e.OnWorld(w)
	return w.Epoch
}

// start forms the first world of the initial members.
func (f *engFake) start(at time.Time) uint64 { return f.announce(at, nil) }

// join lets the started workers in: the next world appends them.
func (f *engFake) join(at time.Time) uint64 {
	f.mu.Lock()
	members := append(slices.Clone(f.members), f.joining...)
	f.joining = nil
	f.mu.Unlock()
	return f.announce(at, members)
}

// drop makes the next world without the named members.
func (f *engFake) drop(names ...string) uint64 {
	f.mu.Lock()
	members := slices.DeleteFunc(slices.Clone(f.members), func(m string) bool { return slices.Contains(names, m) })
	f.mu.Unlock()
	return f.announce(time.Now(), members)
}

// leave makes the next world without every removed worker.
func (f *engFake) leave() uint64 {
	f.mu.Lock()
	removed := slices.Clone(f.removed)
	f.mu.Unlock()
	return f.drop(removed...)
}

// feed reports steps from..to of the current world, every member in turn.
func (f *engFake) feed(from, to int64, rep func(worker string, step int64) StepReport) {
	f.mu.Lock()
	epoch, members := f.epoch, slices.Clone(f.members)
	f.mu.Unlock()
	for step := from; step <= to; step++ {
		for _, m := range members {
			r := rep(m, step)
			r.Worker, r.Epoch, r.Step = m, epoch, step
			f.e.OnReports(m, []StepReport{r})
		}
	}
}

func (f *engFake) Remove(name string) {
	f.mu.Lock()
	f.removed = append(f.removed, name)
	f.removedAt = append(f.removedAt, f.epoch)
	f.mu.Unlock()
	f.removeCh <- name
}

func (f *engFake) Workers() []WorkerInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.known)
}

func (f *engFake) Start(_ context.Context, n int) error {
	f.mu.Lock()
	f.starts = append(f.starts, n)
	err := f.startErr
	if err == nil {
		for range n {
			f.joining = append(f.joining, f.add())
		}
	}
	f.mu.Unlock()
	f.startCh <- n
	return err
}

func (f *engFake) Stop(_ context.Context, w WorkerInfo) error {
	f.mu.Lock()
	f.stops = append(f.stops, w)
	f.stoppedAt = append(f.stoppedAt, f.epoch)
	f.mu.Unlock()
	f.stopCh <- w
	return nil
}

func (f *engFake) record() (starts []int, removed []string, stops []WorkerInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.starts), slices.Clone(f.removed), slices.Clone(f.stops)
}

// engSteady reports samples and a step time for every worker (compute half
// of it).
func engSteady(samples int, stepTime time.Duration) func(string, int64) StepReport {
	return func(string, int64) StepReport {
		return StepReport{Samples: samples, Compute: stepTime / 2, StepTime: stepTime}
	}
}

// engSlow reports 32 samples in 10 ms of compute, 20 ms for the slow workers.
func engSlow(slow ...string) func(string, int64) StepReport {
	return func(w string, _ int64) StepReport {
		c := 10 * time.Millisecond
		if slices.Contains(slow, w) {
			c = 20 * time.Millisecond
		}
		return StepReport{Samples: 32, Compute: c, StepTime: 25 * time.Millisecond}
	}
}

// engLog records the engine's events; tests wait on it.
type engLog struct {
	mu      sync.Mutex
	evs     []Event
	changed chan struct{}
}

func newEngLog() *engLog { return &engLog{changed: make(chan struct{})} }

func (l *engLog) add(ev Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

func (l *engLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.evs)
}

func (l *engLog) matching(kind, substr string) []Event {
	var out []Event
	for _, ev := range l.all() {
		if ev.Kind == kind && strings.Contains(ev.Message, substr) {
			out = append(out, ev)
		}
	}
	return out
}

func (l *engLog) count(kind, substr string) int { return len(l.matching(kind, substr)) }

// wait returns the nth event of kind whose message holds substr, waiting for
// it up to timeout.
func (l *engLog) waitFor(t *testing.T, timeout time.Duration, kind, substr string, n int) Event {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		if evs := l.matching(kind, substr); len(evs) >= n {
			return evs[n-1]
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s event #%d with %q; events:\n%s", kind, n, substr, engDump(l.all()))
		}
	}
}

func (l *engLog) wait(t *testing.T, kind, substr string, n int) Event {
	t.Helper()
	return l.waitFor(t, engWait, kind, substr, n)
}

// kinds lists the event kinds, world events left out.
func (l *engLog) kinds() []string {
	var out []string
	for _, ev := range l.all() {
		if ev.Kind != EventWorld {
			out = append(out, ev.Kind)
		}
	}
	return out
}

func engDump(evs []Event) string {
	var b strings.Builder
	for _, ev := range evs {
		fmt.Fprintf(&b, "  %-9s epoch %d step %d workers %d: %s\n", ev.Kind, ev.Epoch, ev.Step, ev.Workers, ev.Message)
	}
	return b.String()
}

// engRecv receives from ch within engWait.
func engRecv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(engWait):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

// engEventually waits for cond, polling, up to engWait.
func engEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if cond() {
		return
	}
	deadline := time.NewTimer(engWait)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if cond() {
				return
			}
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func engWaitStep(t *testing.T, e *Engine, step int64) {
	t.Helper()
	engEventually(t, fmt.Sprintf("step %d", step), func() bool { return e.Status().Step >= step })
}

// engRun starts an engine on f with cfg, its events going to the returned
// log; it is stopped when the test ends.
func engRun(t *testing.T, cfg EngineConfig, f *engFake) (*Engine, *engLog) {
	t.Helper()
	log := newEngLog()
	cfg.OnEvent = log.add
	e, err := NewEngine(cfg, f, f)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(engWait):
			t.Errorf("Run did not return after its context ended")
		}
	})
	return e, log
}

// engHammer reads Status and Summary from other goroutines until the test
// ends, for the race detector.
func engHammer(t *testing.T, e *Engine) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = e.Status()
				e.Summary().WriteText(io.Discard)
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// engConfig is a configuration without straggler replacement, so that only
// the heuristic acts.
func engConfig(h Heuristic) EngineConfig {
	return EngineConfig{Heuristic: h, MinWorkers: 1, Skip: 3, ActionTimeout: time.Minute}
}

// engFunc is a heuristic deciding with f; it records the step of every call.
type engFunc struct {
	mu    sync.Mutex
	calls []int64
	f     func(h *History) (Decision, error)
}

func engDecide(f func(h *History) (Decision, error)) *engFunc { return &engFunc{f: f} }

// engCounted wraps h to record its calls.
func engCounted(h Heuristic) *engFunc {
	return engDecide(func(hist *History) (Decision, error) { return h.Decide(context.Background(), hist) })
}

func (*engFunc) Name() string { return "eng-func" }

func (h *engFunc) Decide(_ context.Context, hist *History) (Decision, error) {
	h.mu.Lock()
	h.calls = append(h.calls, hist.Step)
	h.mu.Unlock()
	return h.f(hist)
}

func (h *engFunc) steps() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

func (h *engFunc) waitCall(t *testing.T, step int64) {
	t.Helper()
	engEventually(t, fmt.Sprintf("the heuristic to be asked at step %d", step), func() bool { return slices.Contains(h.steps(), step) })
}

// engAt decides d at step, holds otherwise.
func engAt(step int64, d Decision) *engFunc {
	return engDecide(func(h *History) (Decision, error) {
		if h.Step == step {
			return d, nil
		}
		return HoldBecause("waiting for step %d", step), nil
	})
}

func engSchedule(t *testing.T, s string) Heuristic {
	t.Helper()
	h, err := NewRegistry().New(Spec{Name: "fixed-schedule", Params: fmt.Appendf(nil, `{"schedule": %q}`, s)})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func engNear(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// --- aggregation, without Run: onWorld and onReports called directly ---

type engOp struct {
	world   []string // non-nil: a world epoch of these members
	epoch   uint64
	worker  string
	step    int64
	samples int
	time    time.Duration
	total   int64
}

func engW(epoch uint64, members ...string) engOp { return engOp{world: members, epoch: epoch} }

func engR(worker string, epoch uint64, step int64, samples int, d time.Duration) engOp {
	return engOp{worker: worker, epoch: epoch, step: step, samples: samples, time: d}
}

func engApply(e *Engine, ops ...engOp) {
	for _, op := range ops {
		if op.world != nil {
			e.onWorld(WorldChange{Epoch: op.epoch, Members: op.world, At: time.Now()})
			continue
		}
		e.onReports(workerReports{op.worker, []StepReport{{Worker: op.worker, Epoch: op.epoch, Step: op.step,
			Samples: op.samples, Compute: op.time / 2, StepTime: op.time, TotalSteps: op.total}}})
	}
}

func newEngDirect(t *testing.T, cfg EngineConfig) *Engine {
	t.Helper()
	f := newEngFake(0)
	e, err := NewEngine(cfg, f, f)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	return e
}

type engStep struct {
	step  int64
	batch int
	time  time.Duration
}

func TestEngineAggregation(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		ops      []engOp
		want     map[uint64][]engStep // complete steps per epoch
		wantStep int64
	}{
		{"complete once every member reported",
			[]engOp{engW(1, "a", "b", "c"),
				engR("a", 1, 1, 10, 10*ms), engR("b", 1, 1, 20, 20*ms), engR("c", 1, 1, 30, 30*ms),
				engR("a", 1, 2, 10, 10*ms), engR("b", 1, 2, 20, 20*ms)},
			map[uint64][]engStep{1: {{1, 60, 20 * ms}}}, 1},
		{"no member reported all",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 1, 8, ms), engR("a", 1, 2, 8, ms), engR("b", 1, 3, 8, ms)},
			nil, 0},
		{"a non-member's report is ignored",
			[]engOp{engW(1, "a", "b"), engR("x", 1, 1, 100, time.Second), engR("a", 1, 1, 10, 10*ms), engR("b", 1, 1, 10, 30*ms)},
			map[uint64][]engStep{1: {{1, 20, 20 * ms}}}, 1},
		{"a non-member's report does not complete a step",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 1, 10, 10*ms), engR("x", 1, 1, 10, 10*ms)},
			nil, 0},
		{"an unknown epoch is ignored",
			[]engOp{engW(1, "a"), engR("a", 7, 1, 10, 10*ms), engR("a", 0, 2, 10, 10*ms)},
			nil, 0},
		{"a member of a later world reporting an earlier epoch is ignored",
			[]engOp{engW(1, "a", "b"), engW(2, "a", "b", "c"),
				engR("c", 1, 1, 99, time.Second), engR("a", 1, 1, 10, 10*ms), engR("b", 1, 1, 10, 10*ms)},
			map[uint64][]engStep{1: {{1, 20, 10 * ms}}}, 1},
		{"late reports complete the previous epoch's steps",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 5, 10, 10*ms), engW(2, "a"),
				engR("b", 1, 5, 10, 30*ms), engR("a", 2, 6, 16, 40*ms)},
			map[uint64][]engStep{1: {{5, 20, 20 * ms}}, 2: {{6, 16, 40 * ms}}}, 6},
		{"reports two worlds late are dropped",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 5, 10, 10*ms), engW(2, "a", "b"), engW(3, "a", "b"),
				engR("b", 1, 5, 10, 10*ms)},
			nil, 0},
		{"steps completing out of order are kept in order",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 2, 1, 2*ms), engR("a", 1, 1, 1, ms), engR("b", 1, 2, 1, 2*ms),
				engR("a", 1, 3, 1, 3*ms), engR("b", 1, 3, 1, 3*ms), engR("b", 1, 1, 1, ms)},
			map[uint64][]engStep{1: {{1, 2, ms}, {2, 2, 2 * ms}, {3, 2, 3 * ms}}}, 3},
		{"no samples reported",
			[]engOp{engW(1, "a", "b"), engR("a", 1, 1, 0, 10*ms), engR("b", 1, 1, 0, 20*ms)},
			map[uint64][]engStep{1: {{1, 0, 15 * ms}}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngDirect(t, engConfig(nil))
			engApply(e, tc.ops...)
			got := map[uint64][]engStep{}
			for _, p := range e.history.Periods {
				for _, s := range p.Steps {
					got[p.Epoch] = append(got[p.Epoch], engStep{s.Step, s.GlobalBatch, s.Time})
					if len(s.Samples) != p.Workers() || len(s.Compute) != p.Workers() {
						t.Errorf("epoch %d step %d: per-member samples %v, compute %v for members %v", p.Epoch, s.Step, s.Samples, s.Compute, p.Members)
					}
					for w := range s.Samples {
						if !slices.Contains(p.Members, w) {
							t.Errorf("epoch %d step %d counts non-member %s", p.Epoch, s.Step, w)
						}
					}
				}
			}
			want := tc.want
			if want == nil {
				want = map[uint64][]engStep{}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("complete steps %v, want %v", got, want)
			}
			if st := e.Status(); st.Step != tc.wantStep {
				t.Errorf("Status().Step = %d, want %d", st.Step, tc.wantStep)
			}
		})
	}
}

// TestEngineGradientStatistics: the accumulation and the gradient statistics
// the workers report reach the complete step, from whichever member has them.
func TestEngineGradientStatistics(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name    string
		reports map[string]StepReport
		want    StepStats
	}{
		{"every member reports them",
			map[string]StepReport{"a": {Accum: 2, GradSqr: 0.5, GradVar: 3}, "b": {Accum: 2, GradSqr: 0.5, GradVar: 3}},
			StepStats{Accum: 2, GradSqr: 0.5, GradVar: 3}},
		{"one member reports them",
			map[string]StepReport{"a": {}, "b": {Accum: 1, GradSqr: 0, GradVar: 2}},
			StepStats{Accum: 1, GradSqr: 0, GradVar: 2}},
		{"none measured",
			map[string]StepReport{"a": {}, "b": {}},
			StepStats{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngDirect(t, engConfig(nil))
			engApply(e, engW(1, "a", "b"))
			for _, w := range []string{"a", "b"} {
				r := tc.reports[w]
				r.Worker, r.Epoch, r.Step, r.Samples, r.StepTime, r.Compute = w, 1, 1, 8, 10*ms, 5*ms
				e.onReports(workerReports{w, []StepReport{r}})
			}
			steps := e.history.Current().Steps
			if len(steps) != 1 {
				t.Fatalf("%d complete steps", len(steps))
			}
			if s := steps[0]; s.Accum != tc.want.Accum || s.GradSqr != tc.want.GradSqr || s.GradVar != tc.want.GradVar {
				t.Errorf("step: accum %d, grad %v/%v; want %d, %v/%v", s.Accum, s.GradSqr, s.GradVar, tc.want.Accum, tc.want.GradSqr, tc.want.GradVar)
			}
		})
	}
}

func TestEngineTotalSteps(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      int64
		reported []int64
		want     int64
	}{
		{"unknown", 0, []int64{0, 0}, 0},
		{"from reports", 0, []int64{500, 500}, 500},
		{"the newest report", 0, []int64{500, 600}, 600},
		{"a report of 0 keeps it", 0, []int64{500, 0}, 500},
		{"configuration overrides", 1000, []int64{500, 500}, 1000},
		{"configuration without reports", 1000, []int64{0, 0}, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := engConfig(nil)
			cfg.TotalSteps = tc.cfg
			e := newEngDirect(t, cfg)
			engApply(e, engW(1, "a"))
			for i, total := range tc.reported {
				op := engR("a", 1, int64(i+1), 1, time.Millisecond)
				op.total = total
				engApply(e, op)
			}
			if st := e.Status(); st.TotalSteps != tc.want || st.Step != int64(len(tc.reported)) {
				t.Errorf("Status() step %d of %d, want %d of %d", st.Step, st.TotalSteps, len(tc.reported), tc.want)
			}
		})
	}
}

// TestEngineMeasureSkip checks what Status measures of the current world:
// the first Skip steps of each world are left out.
func TestEngineMeasureSkip(t *testing.T) {
	ms := time.Millisecond
	// 2 workers: 3 warm-up steps of 500 ms, then 3 of 20 ms. Every steady
	// step is alike, so the measurement is exact however steps are weighed:
	// a global batch of 64 in 20 ms is 3200 samples/s.
	for _, tc := range []struct {
		name        string
		skip        int
		samples     int     // per worker
		want        float64 // -1: slowed by the warm-up steps (below 1000)
		wantSteps   int
		wantTime    time.Duration // median step time
		wantSamples bool
	}{
		{"skip 3", 3, 32, 3200, 3, 20 * ms, true},
		{"skip none (-1): the warm-up counts", -1, 32, -1, 6, 500 * ms, true},
		{"skip 0 is the default, 3", 0, 32, 3200, 3, 20 * ms, true},
		{"no samples: steps per second", 3, 0, 50, 3, 20 * ms, false},
		{"all skipped", 6, 32, 0, 0, 0, false},
		{"more skipped than run", 10, 32, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := engConfig(nil)
			cfg.Skip = tc.skip
			e := newEngDirect(t, cfg)
			engApply(e, engW(1, "a", "b"))
			for step := int64(1); step <= 6; step++ {
				d := 20 * ms
				if step <= 3 {
					d = 500 * ms
				}
				engApply(e, engR("a", 1, step, tc.samples, d), engR("b", 1, step, tc.samples, d))
			}
			st := e.Status()
			if tc.want >= 0 && !engNear(st.Throughput, tc.want) || tc.want < 0 && (st.Throughput <= 0 || st.Throughput >= 1000) || st.Samples != tc.wantSamples {
				t.Errorf("Status() throughput %v (samples %v), want %v (samples %v)", st.Throughput, st.Samples, tc.want, tc.wantSamples)
			}
			m := e.history.Current().Measure()
			if m.Steps != tc.wantSteps || m.StepTime != tc.wantTime {
				t.Errorf("Measure() over %d steps, step time %v; want %d, %v", m.Steps, m.StepTime, tc.wantSteps, tc.wantTime)
			}
			if tc.wantSteps > 0 && m.GlobalBatch != 2*tc.samples {
				t.Errorf("Measure() global batch %d, want %d", m.GlobalBatch, 2*tc.samples)
			}
		})
	}

	t.Run("each world skips again", func(t *testing.T) {
		e := newEngDirect(t, engConfig(nil))
		engApply(e, engW(1, "a"))
		for step := int64(1); step <= 5; step++ {
			engApply(e, engR("a", 1, step, 10, 10*ms))
		}
		if st := e.Status(); !engNear(st.Throughput, 1000) {
			t.Fatalf("world 1 throughput %v, want 1000", st.Throughput)
		}
		engApply(e, engW(2, "a", "b"))
		for step := int64(6); step <= 9; step++ {
			if st := e.Status(); st.Throughput != 0 || st.Workers != 2 || st.Epoch != 2 {
				t.Fatalf("before step %d of world 2: %+v, want no throughput yet", step, st)
			}
			engApply(e, engR("a", 2, step, 10, 20*ms), engR("b", 2, step, 10, 20*ms))
		}
		if st := e.Status(); !engNear(st.Throughput, 1000) {
			t.Errorf("world 2 throughput %v after its 4th step, want 1000", st.Throughput)
		}
	})

	t.Run("long periods keep the newest steps", func(t *testing.T) {
		e := newEngDirect(t, engConfig(nil))
		engApply(e, engW(1, "a"))
		for step := int64(1); step <= maxStepsPerPeriod+1; step++ {
			engApply(e, engR("a", 1, step, 1, ms))
		}
		p := e.history.Current()
		if len(p.Steps) != maxStepsPerPeriod/2 || p.Steps[len(p.Steps)-1].Step != maxStepsPerPeriod+1 || p.Skip != 0 {
			t.Errorf("after %d steps: %d kept (last %d), skip %d; want %d, last %d, skip 0",
				maxStepsPerPeriod+1, len(p.Steps), p.Steps[len(p.Steps)-1].Step, p.Skip, maxStepsPerPeriod/2, maxStepsPerPeriod+1)
		}
	})

	// A job whose world changes often keeps no more steps than one whose
	// world never changes: the oldest periods give up theirs, and keep
	// their measurement and their step count.
	t.Run("many periods keep maxStepsKept steps in all", func(t *testing.T) {
		e := newEngDirect(t, engConfig(nil))
		const perPeriod = 100
		periods := 3 * maxStepsKept / perPeriod
		step := int64(0)
		var first Measurement
		for ep := uint64(1); ep <= uint64(periods); ep++ {
			engApply(e, engW(ep, "a", "b"))
			for range perPeriod {
				step++
				engApply(e, engR("a", ep, step, 10, 10*ms), engR("b", ep, step, 10, 10*ms))
			}
			if ep == 1 {
				first = e.history.Current().Measure()
			}
		}
		kept := 0
		for _, p := range e.history.Periods {
			kept += len(p.Steps)
			if p.Complete() != perPeriod {
				t.Fatalf("world %d: %d steps complete, want %d", p.Epoch, p.Complete(), perPeriod)
			}
		}
		if kept > maxStepsKept || kept < maxStepsKept-perPeriod {
			t.Errorf("%d periods of %d steps: %d steps kept, want at most %d and no fewer than %d", periods, perPeriod, kept, maxStepsKept, maxStepsKept-perPeriod)
		}
		if cur := e.history.Current(); len(cur.Steps) != perPeriod {
			t.Errorf("the current period kept %d steps, want its %d", len(cur.Steps), perPeriod)
		}
		old := e.history.Periods[0]
		if len(old.Steps) != 0 || old.Measure() != first || first.Steps != perPeriod-3 {
			t.Errorf("the first period: %d steps kept, measurement %+v; want none kept and its measurement %+v (%d steady steps)", len(old.Steps), old.Measure(), first, perPeriod-3)
		}
		if s := e.Summary(); s.Timeline[0].Steps != perPeriod {
			t.Errorf("the summary's first world has %d steps, want %d", s.Timeline[0].Steps, perPeriod)
		}
		if len(e.periods) > 2 {
			t.Errorf("%d periods open to reports, want the current and the previous one", len(e.periods))
		}
	})
}

func TestNewEngineConfig(t *testing.T) {
	f := newEngFake(0)
	for _, tc := range []struct {
		name    string
		cfg     EngineConfig
		cluster Cluster
		prov    Provisioner
		wantErr string
	}{
		{"no cluster", EngineConfig{}, nil, f, "needs a cluster and a provisioner"},
		{"no provisioner", EngineConfig{}, f, nil, "needs a cluster and a provisioner"},
		{"max below min", EngineConfig{MinWorkers: 3, MaxWorkers: 2}, f, f, "max workers 2 below min workers 3"},
		{"max below the minimum of 1", EngineConfig{MinWorkers: 0, MaxWorkers: -1}, f, f, "max workers -1 below min workers 1"},
		{"no skip", EngineConfig{Skip: -1}, f, f, ""},
		{"negative action timeout", EngineConfig{ActionTimeout: -time.Second}, f, f, "must not be negative"},
		{"negative total steps", EngineConfig{TotalSteps: -5}, f, f, "must not be negative"},
		{"bad straggler config", EngineConfig{ReplaceStragglers: true, Straggler: straggler.Config{Alpha: 0.1, Threshold: 2, Sustain: 1}}, f, f, "threshold"},
		{"bad straggler config, replacement off", EngineConfig{Straggler: straggler.Config{Threshold: 2}}, f, f, ""},
		{"zero config", EngineConfig{}, f, f, ""},
		{"max equals min", EngineConfig{MinWorkers: 2, MaxWorkers: 2}, f, f, ""},
		{"defaults", DefaultEngineConfig(), f, f, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEngine(tc.cfg, tc.cluster, tc.prov)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewEngine error %v, want one with %q", err, tc.wantErr)
				}
				if e != nil {
					t.Errorf("NewEngine returned an engine with its error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.cfg.MinWorkers < 1 || e.cfg.ActionTimeout <= 0 || e.cfg.Heuristic == nil {
				t.Errorf("defaults not applied: min %d, timeout %v, heuristic %v", e.cfg.MinWorkers, e.cfg.ActionTimeout, e.cfg.Heuristic)
			}
			if (e.detector != nil) != tc.cfg.ReplaceStragglers {
				t.Errorf("straggler detection %v with ReplaceStragglers %v", e.detector != nil, tc.cfg.ReplaceStragglers)
			}
			if s := e.Summary(); s.SettledAfter != -1 || s.Steps != 0 || len(s.Timeline) != 0 {
				t.Errorf("new engine's summary %+v", s)
			}
		})
	}
	if e, err := NewEngine(EngineConfig{}, f, f); err == nil && (e.cfg.MinWorkers != 1 || e.cfg.ActionTimeout != 2*time.Minute || e.cfg.Skip != 3) {
		t.Errorf("zero config: min %d, timeout %v, skip %d; want 1, 2m, 3", e.cfg.MinWorkers, e.cfg.ActionTimeout, e.cfg.Skip)
	}
	if e, err := NewEngine(EngineConfig{Skip: -1}, f, f); err != nil || e.cfg.Skip != 0 {
		t.Errorf("Skip -1: %v, skip %d; want none", err, e.cfg.Skip)
	}
	if _, err := NewEngine(EngineConfig{MinWorkers: 3, MaxWorkers: 2}, f, f); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("max below min: %v, want ErrInvalidConfig", err)
	}
}

// --- through Run ---

// TestEngineGrowSchedule follows a fixed schedule's grow from decision to
// settling, checking that the heuristic is left alone while workers start.
func TestEngineGrowSchedule(t *testing.T) {
	h := engCounted(engSchedule(t, "0:2,5:4"))
	cfg := engConfig(h)
	cfg.MaxWorkers = 8
	f := newEngFake(2)
	e, log := engRun(t, cfg, f)
	engHammer(t, e)
	f.start(time.Now())

	rep := func(w string, s int64) StepReport {
		r := engSteady(32, 20*time.Millisecond)(w, s)
		r.TotalSteps = 100
		return r
	}
	f.feed(1, 4, rep)
	h.waitCall(t, 4)
	if st := e.Status(); st.Step != 4 || st.TotalSteps != 100 || st.Workers != 2 || st.Epoch != 1 || st.Acting != "" {
		t.Errorf("Status() at step 4: %+v", st)
	}
	if starts, _, _ := f.record(); len(starts) != 0 {
		t.Fatalf("Start called before the schedule's step: %v", starts)
	}

	f.feed(5, 5, rep)
	ev := log.wait(t, EventDecision, "", 1)
	if ev.Decision == nil || ev.Decision.Action != Grow || ev.Decision.Count != 2 || ev.Step != 5 || ev.Workers != 2 {
		t.Fatalf("decision %+v, want grow by 2 at step 5", ev)
	}
	if !strings.Contains(ev.Message, "grow 2 → 4 workers") {
		t.Errorf("decision message %q", ev.Message)
	}
	if n := engRecv(t, f.startCh, "Start"); n != 2 {
		t.Errorf("Start(%d), want Start(2)", n)
	}
	// Start and Remove are called before the action is recorded as pending.
	engEventually(t, "Status().Acting = grow", func() bool { return e.Status().Acting == "grow" })

	// Steps go on while the workers start: the heuristic, which would ask
	// again, is not consulted.
	f.feed(6, 9, rep)
	engWaitStep(t, e, 9)
	if calls := h.steps(); slices.Max(calls) != 5 {
		t.Errorf("heuristic consulted at steps %v while the grow was pending", calls)
	}
	if starts, _, _ := f.record(); !slices.Equal(starts, []int{2}) {
		t.Errorf("Start calls %v, want [2]", starts)
	}
	if n := log.count(EventDone, ""); n != 0 {
		t.Errorf("%d done events before the workers joined", n)
	}

	epoch := f.join(time.Now())
	done := log.wait(t, EventDone, "", 1)
	if !strings.Contains(done.Message, "world grew to 4 workers") || done.Epoch != epoch || done.Workers != 4 {
		t.Errorf("done %+v", done)
	}
	if done.Decision == nil || done.Decision.Action != Grow || done.Decision.Count != 2 {
		t.Errorf("done decision %+v, want grow by 2", done.Decision)
	}
	if st := e.Status(); st.Acting != "" || st.Workers != 4 || st.Epoch != epoch {
		t.Errorf("Status() after growing: %+v", st)
	}

	// At the schedule's last entry the heuristic settles, once. It is asked
	// again as soon as the grow took effect, at step 9 (the steps completed
	// meanwhile are new to it).
	settled := log.wait(t, EventSettled, "", 1)
	if !slices.Contains(h.steps(), 9) {
		t.Errorf("heuristic not consulted once the grow took effect: %v", h.steps())
	}
	f.feed(10, 20, rep)
	engWaitStep(t, e, 20)
	h.waitCall(t, 20)
	if settled.Workers != 4 || settled.Step != 9 || settled.Epoch != epoch || settled.Decision == nil || !settled.Decision.Settled {
		t.Errorf("settled %+v", settled)
	}
	if n := log.count(EventSettled, ""); n != 1 {
		t.Errorf("%d settled events, want 1", n)
	}
	if starts, _, _ := f.record(); !slices.Equal(starts, []int{2}) {
		t.Errorf("Start calls %v, want [2]", starts)
	}
	if got, want := log.kinds(), []string{EventDecision, EventDone, EventSettled}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	s := e.Summary()
	if got := len(s.Events); got != 3 || s.Steps != 20 || s.SettledWorkers != 4 || s.SettledStep != 9 {
		t.Errorf("summary: %d events, %d steps, settled at %d workers step %d", got, s.Steps, s.SettledWorkers, s.SettledStep)
	}
}

func TestEngineGrowDecisions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		h         func(t *testing.T) Heuristic
		max       int
		startErr  error
		wantStart int // 0: Start must not be called
		wantKind  string
		wantMsg   string
	}{
		{"schedule", func(t *testing.T) Heuristic { return engSchedule(t, "0:2,5:5") }, 0, nil, 3, EventDecision, "grow 2 → 5 workers"},
		{"the schedule within max", func(t *testing.T) Heuristic { return engSchedule(t, "0:2,5:9") }, 4, nil, 2, EventDecision, "grow 2 → 4 workers"},
		{"clamped by max", func(*testing.T) Heuristic { return engAt(5, Decision{Action: Grow, Count: 10}) }, 4, nil, 2, EventDecision, "grow 2 → 4 workers"},
		{"at max", func(*testing.T) Heuristic { return engAt(5, Decision{Action: Grow, Count: 1}) }, 2, nil, 0, EventFailed, "cannot grow: 2 workers is the maximum"},
		{"start fails", func(*testing.T) Heuristic { return engAt(5, Decision{Action: Grow, Count: 1}) }, 0, errors.New("no capacity"), 1, EventFailed, "starting 1 workers: no capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := engConfig(tc.h(t))
			cfg.MaxWorkers = tc.max
			f := newEngFake(2)
			f.startErr = tc.startErr
			e, log := engRun(t, cfg, f)
			f.start(time.Now())
			f.feed(1, 5, engSteady(8, 10*time.Millisecond))
			ev := log.wait(t, tc.wantKind, "", 1)
			if !strings.Contains(ev.Message, tc.wantMsg) || ev.Decision == nil || ev.Decision.Action != Grow {
				t.Errorf("%s event %+v, want a grow with %q", ev.Kind, ev, tc.wantMsg)
			}
			if tc.wantStart == 0 {
				engWaitStep(t, e, 5)
				if starts, _, _ := f.record(); len(starts) != 0 {
					t.Errorf("Start called: %v", starts)
				}
				if n := log.count(EventDecision, ""); n != 0 {
					t.Errorf("%d decision events for a grow that cannot happen", n)
				}
				return
			}
			if n := engRecv(t, f.startCh, "Start"); n != tc.wantStart {
				t.Errorf("Start(%d), want Start(%d)", n, tc.wantStart)
			}
			if tc.startErr != nil {
				if st := e.Status(); st.Acting != "" {
					t.Errorf("Status().Acting = %q after Start failed", st.Acting)
				}
				return
			}
			if ev.Decision.Count != tc.wantStart {
				t.Errorf("decision count %d, want %d", ev.Decision.Count, tc.wantStart)
			}
			f.join(time.Now())
			done := log.wait(t, EventDone, "", 1)
			if done.Workers != 2+tc.wantStart || done.Decision == nil || done.Decision.Count != ev.Decision.Count {
				t.Errorf("done %+v (decision %+v) after decision %+v", done, done.Decision, ev.Decision)
			}
		})
	}
}

func TestEngineShrink(t *testing.T) {
	for _, tc := range []struct {
		name    string
		h       func(t *testing.T) Heuristic
		min     int
		size    int
		victims []string // nil: cannot shrink
		wantMsg string
	}{
		{"schedule", func(t *testing.T) Heuristic { return engSchedule(t, "0:4,3:2") }, 1, 4, []string{"w2", "w3"}, "shrink 4 → 2 workers"},
		{"the schedule within min", func(t *testing.T) Heuristic { return engSchedule(t, "0:4,3:1") }, 3, 4, []string{"w3"}, "shrink 4 → 3 workers"},
		{"clamped by min", func(*testing.T) Heuristic { return engAt(3, Decision{Action: Shrink, Count: 10}) }, 2, 4, []string{"w2", "w3"}, "shrink 4 → 2 workers"},
		{"rank 0 stays", func(*testing.T) Heuristic { return engAt(3, Decision{Action: Shrink, Count: 3}) }, 1, 4, []string{"w1", "w2", "w3"}, "shrink 4 → 1 workers"},
		{"at min", func(*testing.T) Heuristic { return engAt(3, Decision{Action: Shrink, Count: 1}) }, 2, 2, nil, "cannot shrink: 2 workers is the minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := engConfig(tc.h(t))
			cfg.MinWorkers = tc.min
			f := newEngFake(tc.size)
			e, log := engRun(t, cfg, f)
			engHammer(t, e)
			f.start(time.Now())
			f.feed(1, 3, engSteady(8, 10*time.Millisecond))
			if tc.victims == nil {
				ev := log.wait(t, EventFailed, tc.wantMsg, 1)
				if ev.Decision == nil || ev.Decision.Action != Shrink {
					t.Errorf("failed event %+v", ev)
				}
				if _, removed, _ := f.record(); len(removed) != 0 {
					t.Errorf("Remove called: %v", removed)
				}
				return
			}
			ev := log.wait(t, EventDecision, "", 1)
			if !strings.Contains(ev.Message, tc.wantMsg) || ev.Decision.Count != len(tc.victims) {
				t.Errorf("decision %q (count %d), want %q", ev.Message, ev.Decision.Count, tc.wantMsg)
			}
			var removed []string
			for range tc.victims {
				removed = append(removed, engRecv(t, f.removeCh, "Remove"))
			}
			slices.Sort(removed)
			if !slices.Equal(removed, tc.victims) {
				t.Errorf("removed %v, want %v", removed, tc.victims)
			}
			// Start and Remove are called before the action is recorded as pending.
			engEventually(t, "Status().Acting = shrink", func() bool { return e.Status().Acting == "shrink" })

			// The victims leave one world at a time: only once all are out is
			// the shrink done and are they stopped.
			var last uint64
			for i := len(tc.victims) - 1; i >= 0; i-- {
				last = f.drop(tc.victims[i])
			}
			done := log.wait(t, EventDone, "", 1)
			want := fmt.Sprintf("world shrank to %d workers", tc.size-len(tc.victims))
			if !strings.Contains(done.Message, want) || done.Epoch != last {
				t.Errorf("done in world %d: %q; want world %d: %q", done.Epoch, done.Message, last, want)
			}
			var stopped []WorkerInfo
			for range tc.victims {
				stopped = append(stopped, engRecv(t, f.stopCh, "Stop"))
			}
			slices.SortFunc(stopped, func(a, b WorkerInfo) int { return strings.Compare(a.Name, b.Name) })
			for i, w := range stopped {
				if want := f.info(tc.victims[i]); w != want || w.PID == 0 {
					t.Errorf("Stop(%+v), want Stop(%+v)", w, want)
				}
			}
			if n := log.count(EventDone, ""); n != 1 {
				t.Errorf("%d done events", n)
			}
			if st := e.Status(); st.Acting != "" || st.Workers != tc.size-len(tc.victims) {
				t.Errorf("Status() after shrinking: %+v", st)
			}
		})
	}
}

// TestEngineStragglerReplacement: a member computing at half the others'
// speed is flagged after warmup+sustain steps, replaced once its replacement
// is in, stopped once it is out; its replacement, slow as well, is not
// replaced again within the back-off.
func TestEngineStragglerReplacement(t *testing.T) {
	cfg := DefaultEngineConfig()
	cfg.ReplaceStragglers = true
	cfg.ActionTimeout = time.Minute
	f := newEngFake(3)
	e, log := engRun(t, cfg, f)
	engHammer(t, e)
	f.start(time.Now())

	sc := straggler.DefaultConfig()
	flagAt := int64(sc.Warmup + sc.Sustain) // 13
	f.feed(1, flagAt-1, engSlow("w2"))
	engWaitStep(t, e, flagAt-1)
	if n := len(log.matching(EventDecision, "")); n != 0 {
		t.Fatalf("%d decisions before step %d:\n%s", n, flagAt, engDump(log.all()))
	}
	f.feed(flagAt, flagAt, engSlow("w2"))
	ev := log.wait(t, EventDecision, "", 1)
	if d := ev.Decision; d == nil || d.Action != Replace || d.Worker != "w2" || ev.Step != flagAt ||
		!engNear(d.Numbers["relative_throughput"], 0.5) || d.Numbers["steps_below"] != float64(sc.Sustain) {
		t.Fatalf("decision %+v (%+v), want replace w2 at step %d", ev, ev.Decision, flagAt)
	}
	if n := engRecv(t, f.startCh, "Start"); n != 1 {
		t.Errorf("Start(%d), want Start(1)", n)
	}
	// Start and Remove are called before the action is recorded as pending.
	engEventually(t, "Status().Acting = replace", func() bool { return e.Status().Acting == "replace" })

	// Until its replacement is in, the straggler stays.
	f.feed(flagAt+1, flagAt+3, engSlow("w2"))
	engWaitStep(t, e, flagAt+3)
	if _, removed, _ := f.record(); len(removed) != 0 {
		t.Fatalf("Remove(%v) before the replacement joined", removed)
	}

	joined := f.join(time.Now()) // w0 w1 w2 w3
	if got := engRecv(t, f.removeCh, "Remove"); got != "w2" {
		t.Errorf("Remove(%s), want Remove(w2)", got)
	}
	f.mu.Lock()
	removedAt := slices.Clone(f.removedAt)
	f.mu.Unlock()
	if !slices.Equal(removedAt, []uint64{joined}) {
		t.Errorf("Remove called in worlds %v, want only in world %d (the replacement's)", removedAt, joined)
	}
	log.wait(t, EventStraggler, "replacement w3 is in the world; removing w2", 1)

	f.feed(flagAt+4, flagAt+5, engSlow("w2"))
	engWaitStep(t, e, flagAt+5)
	if _, _, stops := f.record(); len(stops) != 0 || log.count(EventDone, "") != 0 {
		t.Fatalf("stopped %v / done before the straggler left", stops)
	}

	gone := f.leave() // w0 w1 w3
	done := log.wait(t, EventDone, "", 1)
	if !strings.Contains(done.Message, "w2 replaced by w3") || done.Epoch != gone || done.Workers != 3 {
		t.Errorf("done %+v", done)
	}
	if w := engRecv(t, f.stopCh, "Stop"); w != f.info("w2") || w.PID == 0 {
		t.Errorf("Stop(%+v), want Stop(%+v)", w, f.info("w2"))
	}
	if s := e.Summary(); s.Replacements != 1 {
		t.Errorf("Summary().Replacements = %d, want 1", s.Replacements)
	}

	// The replacement is slow too: the slot is backed off, said once.
	replacedAt := flagAt + 5
	f.feed(replacedAt+1, replacedAt+40, engSlow("w3"))
	ev = log.wait(t, EventStraggler, "not replacing it", 1)
	if want := fmt.Sprintf("backing off until step %d", replacedAt+sc.Backoff); !strings.Contains(ev.Message, want) || !strings.Contains(ev.Message, "w3") {
		t.Errorf("straggler event %q, want one about w3 %q", ev.Message, want)
	}
	engWaitStep(t, e, replacedAt+40)
	if n := log.count(EventStraggler, "not replacing it"); n != 1 {
		t.Errorf("%d straggler events saying it is not replaced, want 1", n)
	}
	if starts, _, _ := f.record(); !slices.Equal(starts, []int{1}) {
		t.Errorf("Start calls %v, want [1]", starts)
	}
	if got, want := log.kinds(), []string{EventDecision, EventStraggler, EventDone, EventStraggler}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v:\n%s", got, want, engDump(log.all()))
	}
}

func TestEngineStragglerLeftByItself(t *testing.T) {
	cfg := DefaultEngineConfig()
	cfg.ReplaceStragglers = true
	f := newEngFake(3)
	e, log := engRun(t, cfg, f)
	f.start(time.Now())
	f.feed(1, 13, engSlow("w2"))
	log.wait(t, EventDecision, "", 1)
	engRecv(t, f.startCh, "Start")

	// The replacement joins while the straggler left by itself.
	world := f.announce(time.Now(), []string{"w0", "w1", "w3"})
	done := log.wait(t, EventDone, "w3 joined; w2 had already left", 1)
	if done.Epoch != world {
		t.Errorf("done in world %d, want %d", done.Epoch, world)
	}
	if s := e.Summary(); s.Replacements != 1 {
		t.Errorf("Summary().Replacements = %d, want 1", s.Replacements)
	}
	if _, removed, stops := f.record(); len(removed) != 0 || len(stops) != 0 {
		t.Errorf("removed %v, stopped %v: nothing to remove or stop", removed, stops)
	}
}

func TestEngineStragglersNotReplaced(t *testing.T) {
	cfg := engConfig(nil) // ReplaceStragglers off
	f := newEngFake(3)
	e, log := engRun(t, cfg, f)
	f.start(time.Now())
	f.feed(1, 30, engSlow("w2"))
	engWaitStep(t, e, 30)
	if got := log.kinds(); len(got) != 0 {
		t.Errorf("events %v without straggler replacement", got)
	}
	if starts, removed, _ := f.record(); len(starts) != 0 || len(removed) != 0 {
		t.Errorf("started %v, removed %v", starts, removed)
	}
}

func TestEngineActionTimeout(t *testing.T) {
	h := engCounted(engSchedule(t, "0:1,2:2"))
	cfg := engConfig(h)
	cfg.ActionTimeout = 200 * time.Millisecond
	f := newEngFake(1)
	e, log := engRun(t, cfg, f)
	f.start(time.Now())
	start := time.Now() // before the decision
	f.feed(1, 2, engSteady(8, 10*time.Millisecond))
	log.wait(t, EventDecision, "grow 1 → 2", 1)
	engRecv(t, f.startCh, "Start")

	// The worker never joins. The engine checks every second.
	ev := log.waitFor(t, 3*time.Second, EventFailed, "not carried out within 200ms", 1)
	if waited := time.Since(start); waited < cfg.ActionTimeout {
		t.Errorf("failed after %v, before the timeout", waited)
	}
	if ev.Decision == nil || ev.Decision.Action != Grow || ev.Workers != 1 {
		t.Errorf("failed event %+v", ev)
	}
	if st := e.Status(); st.Acting != "" {
		t.Errorf("Status().Acting = %q after the timeout", st.Acting)
	}
	// The heuristic is asked again, and asks again.
	f.feed(3, 3, engSteady(8, 10*time.Millisecond))
	h.waitCall(t, 3)
	if n := engRecv(t, f.startCh, "the second Start"); n != 1 {
		t.Errorf("Start(%d), want Start(1)", n)
	}
}

// A grow whose worker is lost before it joins (OnStartLost: it crashed while
// starting) fails at once, not after the action timeout, and the heuristic
// grows again once the engine's quiet time after a failure is over.
func TestEngineGrowLostBeforeJoining(t *testing.T) {
	h := engCounted(engSchedule(t, "0:1,2:2"))
	cfg := engConfig(h) // a minute's action timeout
	f := newEngFake(1)
	e, log := engRun(t, cfg, f)
	f.start(time.Now())
	f.feed(1, 2, engSteady(8, 10*time.Millisecond))
	log.wait(t, EventDecision, "grow 1 → 2", 1)
	engRecv(t, f.startCh, "Start")
	lostAt := time.Now()
	e.OnStartLost()
	ev := log.waitFor(t, 3*time.Second, EventFailed, "1 of the 1 workers started were lost before they joined", 1)
	if ev.Decision == nil || ev.Decision.Action != Grow || ev.Workers != 1 {
		t.Errorf("failed event %+v", ev)
	}
	if st := e.Status(); st.Acting != "" {
		t.Errorf("Status().Acting = %q after the loss", st.Acting)
	}
	// Steps go on: the heuristic asks again after the quiet time.
	for step := int64(3); ; step++ {
		f.feed(step, step, engSteady(8, 10*time.Millisecond))
		select {
		case n := <-f.startCh:
			if n != 1 {
				t.Errorf("Start(%d), want Start(1)", n)
			}
			if waited := time.Since(lostAt); waited < failureQuiet || waited > failureQuiet+10*time.Second {
				t.Errorf("started again %v after the loss, want after the %v quiet time", waited, failureQuiet)
			}
			return
		case <-time.After(100 * time.Millisecond): // the next step, as a trainer reports them
		}
		if time.Since(lostAt) > cfg.ActionTimeout {
			t.Fatal("no second grow")
		}
	}
}

// A grow whose workers joined while others left (preempted) is carried
// out: the engine does not wait for a size the world cannot reach until the
// action timeout, it asks the heuristic again, which grows again.
func TestEngineGrowWhileOthersLeave(t *testing.T) {
	h := engCounted(engSchedule(t, "0:3"))
	f := newEngFake(2)
	_, log := engRun(t, engConfig(h), f)
	f.start(time.Now())
	f.feed(1, 4, engSteady(8, 10*time.Millisecond))
	log.wait(t, EventDecision, "grow 2 → 3", 1)
	engRecv(t, f.startCh, "Start")
	f.drop("w1") // preempted while w2 starts
	f.join(time.Now())
	done := log.wait(t, EventDone, "1 workers joined, 1 left meanwhile: the world has 2", 1)
	if done.Decision == nil || done.Decision.Action != Grow {
		t.Errorf("done event %+v", done)
	}
	f.feed(5, 8, engSteady(8, 10*time.Millisecond))
	log.wait(t, EventDecision, "grow 2 → 3", 2)
	if n := engRecv(t, f.startCh, "the second Start"); n != 1 {
		t.Errorf("Start(%d), want Start(1)", n)
	}
	if n := log.count(EventFailed, ""); n != 0 {
		t.Errorf("%d failed events", n)
	}
}

func TestEngineHeuristicErrors(t *testing.T) {
	script := map[int64]Decision{
		4:  HoldBecause("fine"),
		6:  {Action: Grow},
		7:  {Action: Grow},
		8:  {Action: Action(42)},
		9:  {Action: Shrink, Count: -1},
		10: {Action: Replace},
	}
	errs := map[int64]error{1: errors.New("boom"), 2: errors.New("boom"), 3: errors.New("bang"), 5: errors.New("boom")}
	h := engDecide(func(hist *History) (Decision, error) {
		if err := errs[hist.Step]; err != nil {
			return Decision{}, err
		}
		return script[hist.Step], nil
	})
	f := newEngFake(2)
	e, log := engRun(t, engConfig(h), f)
	f.start(time.Now())
	want := []string{
		"eng-func: boom (holding)",
		"eng-func: bang (holding)",
		"eng-func: boom (holding)", // again after a good decision
		"grow decision needs a positive count, got 0",
		"unknown action 42",
		"shrink decision needs a positive count, got -1",
		"replace decision names no worker",
	}
	for step := int64(1); step <= 10; step++ {
		f.feed(step, step, engSteady(8, 10*time.Millisecond))
		h.waitCall(t, step)
	}
	engWaitStep(t, e, 10)
	var got []string
	for _, ev := range log.all() {
		if ev.Kind != EventWorld {
			got = append(got, ev.Kind+": "+ev.Message)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("events:\n%s\nwant %d errors: %q", strings.Join(got, "\n"), len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], EventError+": ") || !strings.Contains(got[i], want[i]) {
			t.Errorf("event %d: %q, want an error with %q", i, got[i], want[i])
		}
	}
	if starts, removed, _ := f.record(); len(starts) != 0 || len(removed) != 0 {
		t.Errorf("started %v, removed %v on bad decisions", starts, removed)
	}
	if st := e.Status(); st.Acting != "" || st.Workers != 2 {
		t.Errorf("Status() %+v", st)
	}
}

func TestEngineBadDecisions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		d        Decision
		wantKind string
		wantMsg  string
	}{
		{"grow by 0", Decision{Action: Grow}, EventError, "grow decision needs a positive count, got 0"},
		{"shrink by 0", Decision{Action: Shrink}, EventError, "shrink decision needs a positive count, got 0"},
		{"replace nobody", Decision{Action: Replace}, EventError, "replace decision names no worker"},
		{"unknown action", Decision{Action: Action(7)}, EventError, "unknown action 7"},
		{"replace a non-member", Decision{Action: Replace, Worker: "w9"}, EventFailed, "cannot replace w9: not in the world"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := engDecide(func(*History) (Decision, error) { return tc.d, nil })
			f := newEngFake(2)
			e, log := engRun(t, engConfig(h), f)
			f.start(time.Now())
			for step := int64(1); step <= 3; step++ {
				f.feed(step, step, engSteady(8, 10*time.Millisecond))
				// A decision that failed quiets the engine for a while
				// (failureQuiet): the heuristic is not asked again at once.
				if step == 1 || tc.wantKind == EventError {
					h.waitCall(t, step)
				}
			}
			engWaitStep(t, e, 3)
			ev := log.wait(t, tc.wantKind, tc.wantMsg, 1)
			if n := log.count(EventFailed, ""); tc.wantKind == EventFailed && n != 1 {
				t.Errorf("%d failed events, want 1", n)
			}
			if tc.wantKind == EventError {
				if n := log.count(EventError, ""); n != 1 {
					t.Errorf("%d error events for the same error, want 1", n)
				}
			}
			if ev.Step < 1 {
				t.Errorf("event %+v", ev)
			}
			if starts, removed, _ := f.record(); len(starts) != 0 || len(removed) != 0 {
				t.Errorf("started %v, removed %v", starts, removed)
			}
			if st := e.Status(); st.Acting != "" || st.Step != 3 {
				t.Errorf("Status() %+v", st)
			}
		})
	}
}

// TestEngineSettledSummary: a grow marked Settled settles once it took
// effect; the summary has the timeline, the throughput per size and when it
// settled.
func TestEngineSettledSummary(t *testing.T) {
	h := engDecide(func(hist *History) (Decision, error) {
		switch {
		case hist.Workers() == 2 && hist.Step >= 13:
			return Decision{Action: Grow, Count: 1, Settled: true, Reason: "3 is the one"}, nil
		case hist.Workers() == 3:
			return Decision{Action: Hold, Settled: true, Reason: "settled at 3"}, nil
		}
		return HoldBecause("measuring"), nil
	})
	f := newEngFake(2)
	e, log := engRun(t, engConfig(h), f)
	engHammer(t, e)
	t0 := time.Now().Add(-time.Minute)
	f.start(t0)

	// World 1, 2 workers: 3 skipped steps, then 10 of 20 ms with a global
	// batch of 64: 640 samples in 0.2 s.
	f.feed(1, 3, engSteady(32, 500*time.Millisecond))
	f.feed(4, 13, engSteady(32, 20*time.Millisecond))
	ev := log.wait(t, EventDecision, "", 1)
	if ev.Decision == nil || ev.Decision.Action != Grow || !ev.Decision.Settled || ev.Step != 13 {
		t.Fatalf("decision %+v", ev)
	}
	engRecv(t, f.startCh, "Start")
	if n := log.count(EventSettled, ""); n != 0 {
		t.Fatalf("settled before the decision took effect")
	}

	// World 2, 3 workers, from 20 s in: 3 skipped, then 10 of 25 ms with a
	// global batch of 96: 960 samples in 0.25 s.
	world := f.join(t0.Add(20 * time.Second))
	done := log.wait(t, EventDone, "", 1)
	settled := log.wait(t, EventSettled, "", 1)
	if settled.Workers != 3 || settled.Step != 13 || settled.Epoch != world || !strings.Contains(settled.Message, "settled at 3 workers (3 is the one)") {
		t.Errorf("settled %+v", settled)
	}
	if done.Epoch != world {
		t.Errorf("done %+v", done)
	}
	f.feed(14, 16, engSteady(32, 500*time.Millisecond))
	f.feed(17, 26, engSteady(32, 25*time.Millisecond))
	engWaitStep(t, e, 26)
	h.waitCall(t, 26)
	if n := log.count(EventSettled, ""); n != 1 {
		t.Errorf("%d settled events, want 1", n)
	}
	if st := e.Status(); !engNear(st.Throughput, 3840) || !st.Samples || st.Workers != 3 {
		t.Errorf("Status() %+v, want 3840 samples/s at 3 workers", st)
	}

	s := e.Summary()
	if s.SettledWorkers != 3 || s.SettledStep != 13 || s.SettledAfter < 60 || s.SettledAfter > 600 || !engNear(s.SettledAfter, settled.Elapsed) {
		t.Errorf("settled at %d workers, step %d, after %v s (event: %v s)", s.SettledWorkers, s.SettledStep, s.SettledAfter, settled.Elapsed)
	}
	if s.Steps != 26 || s.Elapsed < 60 || s.Replacements != 0 {
		t.Errorf("summary: %d steps, %v s, %d replacements", s.Steps, s.Elapsed, s.Replacements)
	}
	if len(s.Timeline) != 2 {
		t.Fatalf("timeline %+v", s.Timeline)
	}
	if sp := s.Timeline[0]; sp != (Span{Epoch: 1, Workers: 2, StartS: 0, Duration: 20, Steps: 13}) {
		t.Errorf("first span %+v", sp)
	}
	if sp := s.Timeline[1]; sp.Epoch != world || sp.Workers != 3 || sp.StartS != 20 || sp.Duration < 40 || sp.Steps != 13 {
		t.Errorf("second span %+v", sp)
	}
	want := []Measurement{
		{Workers: 2, Epoch: 1, Steps: 10, Throughput: 3200, StepTime: 20 * time.Millisecond, GlobalBatch: 64},
		{Workers: 3, Epoch: world, Steps: 10, Throughput: 3840, StepTime: 25 * time.Millisecond, GlobalBatch: 96},
	}
	if len(s.Throughput) != len(want) {
		t.Fatalf("throughput %+v, want %+v", s.Throughput, want)
	}
	for i, m := range s.Throughput {
		w := want[i]
		if !engNear(m.Throughput, w.Throughput) {
			t.Errorf("throughput[%d] = %v, want %v", i, m.Throughput, w.Throughput)
		}
		m.Throughput = w.Throughput
		if m != w {
			t.Errorf("throughput[%d] = %+v, want %+v", i, m, w)
		}
	}
	if got, want := log.kinds(), []string{EventDecision, EventDone, EventSettled}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	if len(s.Events) != 3 {
		t.Errorf("summary events %+v, want decision, done, settled", s.Events)
	}
	var b strings.Builder
	s.WriteText(&b)
	for _, want := range []string{"26 steps", "3200.0", "3840.0", "samples/s", "settled at 3 workers", "decision"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary text lacks %q:\n%s", want, b.String())
		}
	}
}

// TestEngineConcurrentReads runs a grow and a shrink while other goroutines
// read Status and Summary (for the race detector).
func TestEngineConcurrentReads(t *testing.T) {
	h := engSchedule(t, "0:2,4:4,12:1")
	f := newEngFake(2)
	e, log := engRun(t, engConfig(h), f)
	for range 3 {
		engHammer(t, e)
	}
	f.start(time.Now())
	f.feed(1, 4, engSteady(16, 5*time.Millisecond))
	engRecv(t, f.startCh, "Start")
	f.join(time.Now())
	log.wait(t, EventDone, "grew to 4", 1)
	f.feed(5, 12, engSteady(16, 5*time.Millisecond))
	for range 3 {
		engRecv(t, f.removeCh, "Remove")
	}
	f.leave()
	log.wait(t, EventDone, "shrank to 1", 1)
	for range 3 {
		engRecv(t, f.stopCh, "Stop")
	}
	f.feed(13, 20, engSteady(16, 5*time.Millisecond))
	log.wait(t, EventSettled, "", 1)
	engWaitStep(t, e, 20)
	if s := e.Summary(); len(s.Timeline) != 3 || len(s.Throughput) != 3 {
		t.Errorf("summary timeline %+v, throughput %+v", s.Timeline, s.Throughput)
	}
}

// engBackground answers in the background: its first Decide holds, and the
// test later gives the answer and wakes the engine as the exec heuristic does.
type engBackground struct {
	*engFunc
	mu     sync.Mutex
	ready  func()
	answer *Decision
}

func (h *engBackground) OnReady(ready func()) {
	h.mu.Lock()
	h.ready = ready
	h.mu.Unlock()
}

// give makes d the answer of the work in progress and wakes the engine; it
// reports false if the engine handed over no wake-up.
func (h *engBackground) give(d Decision) bool {
	h.mu.Lock()
	h.answer = &d
	ready := h.ready
	h.mu.Unlock()
	if ready == nil {
		return false
	}
	ready()
	return true
}

// An answer ready in the background is acted on at once, without waiting for
// the next reported step, also from inside a composition.
func TestEngineBackgroundHeuristic(t *testing.T) {
	for _, compose := range []bool{false, true} {
		t.Run(fmt.Sprintf("composed=%v", compose), func(t *testing.T) {
			bg := &engBackground{}
			bg.engFunc = engDecide(func(*History) (Decision, error) {
				bg.mu.Lock()
				defer bg.mu.Unlock()
				if bg.answer == nil {
					return HoldBecause("working"), nil
				}
				d := *bg.answer
				bg.answer = nil
				return d, nil
			})
			var h Heuristic = bg
			if compose {
				h = &composite{name: "any-of", members: []Heuristic{engAt(1000, HoldBecause("x")), bg}}
			}
			f := newEngFake(2)
			_, log := engRun(t, engConfig(h), f)
			f.start(time.Now())
			f.feed(1, 5, engSteady(8, 10*time.Millisecond))
			bg.waitCall(t, 5)
			calls := len(bg.steps())
			if !bg.give(Decision{Action: Grow, Count: 1, Reason: "the answer"}) {
				t.Fatal("the engine gave the heuristic no wake-up")
			}
			select {
			case n := <-f.startCh:
				if n != 1 {
					t.Fatalf("started %d workers, want 1", n)
				}
			case <-time.After(engWait):
				t.Fatalf("the engine did not act on the answer; the heuristic was asked at steps %v", bg.steps())
			}
			if got := bg.steps()[calls:]; !slices.Equal(got, []int64{5}) {
				t.Errorf("asked again at steps %v, want once more at step 5", got)
			}
			log.wait(t, EventDecision, "the answer", 1)
		})
	}
}
