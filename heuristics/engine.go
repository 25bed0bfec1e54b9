package heuristics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/straggler"
)

// WorldChange is a new world epoch of the job, as the driver proposed it.
type WorldChange struct {
	Epoch   uint64
	Members []string // in rank order
	At      time.Time
}

// WorkerInfo identifies a worker process for a provisioner.
type WorkerInfo struct {
	Name string
	Host string
	PID  int // 0 when unknown
}

// Cluster is the engine's handle on the job's membership (the driver).
type Cluster interface {
	// Remove takes a worker out of the job: the next world leaves it out.
	Remove(name string)
	// Workers lists the workers the driver knows of, joined or joining.
	Workers() []WorkerInfo
}

// Provisioner starts and stops workers: local processes for `gorovod run`,
// whatever a cluster manager offers elsewhere.
type Provisioner interface {
	// Start launches n more workers; each joins the job by itself once its
	// start-up is done.
	Start(ctx context.Context, n int) error
	// Stop makes sure a worker the engine removed from the job ends: it is
	// called once the world has moved on without the worker, which normally
	// exits by itself; a provisioner gives it a grace period, then
	// terminates it.
	Stop(ctx context.Context, w WorkerInfo) error
}

// EngineConfig configures the autoscaling engine. A zero field means its
// default (DefaultEngineConfig).
type EngineConfig struct {
	// Heuristic decides; nil holds (measure and replace stragglers only).
	Heuristic Heuristic
	// ReplaceStragglers enables straggler replacement, tuned by Straggler.
	ReplaceStragglers bool
	Straggler         straggler.Config
	// MinWorkers and MaxWorkers bound every decision (MaxWorkers 0: none).
	// A straggler's replacement may exceed MaxWorkers by one while it joins:
	// the world must not shrink before the replacement is in.
	MinWorkers, MaxWorkers int
	// Skip is how many steps after each world change are not measured
	// (negative: none).
	Skip int
	// TotalSteps overrides the length trainers report (0: theirs).
	TotalSteps int64
	// ActionTimeout bounds the wait for a decision to show in the world
	// (workers to start and join, or to leave).
	ActionTimeout time.Duration
	// OnEvent receives decisions, world changes and outcomes, on the
	// engine's goroutine.
	OnEvent func(Event)
}

// ErrInvalidConfig is wrapped by every error about an EngineConfig that
// cannot work.
var ErrInvalidConfig = errors.New("heuristics: invalid configuration")

// DefaultEngineConfig returns the defaults: no heuristic, straggler
// replacement off (on, it uses Or et al.'s settings), the first 3 steps of a
// world skipped, 2 minutes for a decision to take effect.
func DefaultEngineConfig() EngineConfig {
	return EngineConfig{Straggler: straggler.DefaultConfig(), MinWorkers: 1, Skip: 3, ActionTimeout: 2 * time.Minute}
}

// Event kinds.
const (
	EventWorld     = "world"     // a new world epoch formed
	EventDecision  = "decision"  // the engine acts on a decision
	EventDone      = "done"      // a decision took effect
	EventFailed    = "failed"    // a decision could not be carried out
	EventSettled   = "settled"   // the heuristic found its target
	EventStraggler = "straggler" // a straggler was found (and whether it is replaced)
	EventError     = "error"     // the heuristic failed; the engine holds
)

// Event is one line of the engine's log.
type Event struct {
	Kind     string    `json:"event"`
	Time     time.Time `json:"time"`
	Elapsed  float64   `json:"elapsed_s"` // since the first world formed
	Step     int64     `json:"step"`
	Workers  int       `json:"workers"`
	Epoch    uint64    `json:"world_epoch"`
	Decision *Decision `json:"decision,omitempty"`
	Message  string    `json:"message"`
}

// Engine measures an elastic job from its workers' step reports and carries
// out its heuristic's decisions. Feed it with OnWorld and OnReports (they
// never block, so the driver's goroutine can call them); Run does the work.
type Engine struct {
	cfg      EngineConfig
	cluster  Cluster
	prov     Provisioner
	detector *straggler.Detector
	policy   *straggler.Policy

	in      stdsync.Mutex
	worlds  []WorldChange
	reports []workerReports
	notes   []Event // from Stop goroutines, emitted by Run
	ready   bool    // a Background heuristic has an answer
	lost    int     // workers started and lost before they joined (OnStartLost)
	wake    chan struct{}

	// mu guards what Status and Summary read; only Run's goroutine writes.
	mu       stdsync.Mutex
	history  History
	periods  map[uint64]*Period // the periods reports may still complete steps of
	kept     int                // steps in the history's periods
	keptFrom int                // the periods before this index gave up their steps
	partial  map[uint64]map[int64]*partialStep
	events   []Event
	settled  *Event
	replaced int

	pending   *action // written under mu
	flags     []straggler.Flag
	lastStep  int64 // newest complete step the heuristic has seen
	told      map[string]bool
	lastError string
	// lastFailure and quietUntil keep a heuristic that keeps asking for the
	// impossible (grow at the maximum, a provisioner that cannot start
	// workers) from flooding the log and the provisioner.
	lastFailure string
	quietUntil  time.Time
}

type workerReports struct {
	worker string
	steps  []StepReport
}

type partialStep struct {
	samples map[string]int
	compute map[string]time.Duration
	times   map[string]time.Duration
	// accum and the gradient statistics: the same on every member, taken
	// from any that reports them.
	accum            int
	gradSqr, gradVar float64
}

// action is a decision being carried out.
type action struct {
	d       Decision
	started time.Time
	target  int                   // Grow: the world size to reach
	before  map[string]bool       // members when it started
	victims map[string]WorkerInfo // Shrink, and Replace once its replacement is in
	old     string                // Replace: the straggler
	joined  string                // Replace: its replacement, once in the world
	lost    int                   // Grow, Replace: workers it started lost before they joined
}

// NewEngine returns an engine acting on cluster through prov.
func NewEngine(cfg EngineConfig, cluster Cluster, prov Provisioner) (*Engine, error) {
	if cluster == nil || prov == nil {
		return nil, errors.New("heuristics: NewEngine needs a cluster and a provisioner")
	}
	d := DefaultEngineConfig()
	cfg.MinWorkers = max(cfg.MinWorkers, 1)
	if cfg.MaxWorkers != 0 && cfg.MaxWorkers < cfg.MinWorkers {
		return nil, fmt.Errorf("%w: max workers %d below min workers %d", ErrInvalidConfig, cfg.MaxWorkers, cfg.MinWorkers)
	}
	switch {
	case cfg.Skip == 0:
		cfg.Skip = d.Skip
	case cfg.Skip < 0:
		cfg.Skip = 0
	}
	if cfg.TotalSteps < 0 || cfg.ActionTimeout < 0 {
		return nil, fmt.Errorf("%w: total steps and the action timeout must not be negative", ErrInvalidConfig)
	}
	if cfg.ActionTimeout == 0 {
		cfg.ActionTimeout = d.ActionTimeout
	}
	if cfg.Heuristic == nil {
		cfg.Heuristic = holdHeuristic{}
	}
	e := &Engine{cfg: cfg, cluster: cluster, prov: prov, wake: make(chan struct{}, 1),
		periods: map[uint64]*Period{}, partial: map[uint64]map[int64]*partialStep{}, told: map[string]bool{}}
	if cfg.ReplaceStragglers {
		d, err := straggler.NewDetector(cfg.Straggler)
		if err != nil {
			return nil, err
		}
		e.detector, e.policy = d, straggler.NewPolicy(cfg.Straggler)
	}
	e.history = History{MinWorkers: cfg.MinWorkers, MaxWorkers: cfg.MaxWorkers, TotalSteps: cfg.TotalSteps}
	if b, ok := cfg.Heuristic.(Background); ok {
		b.OnReady(e.heuristicReady)
	}
	return e, nil
}

// OnWorld tells the engine of a new world epoch.
func (e *Engine) OnWorld(w WorldChange) {
	e.in.Lock()
	e.worlds = append(e.worlds, WorldChange{Epoch: w.Epoch, Members: slices.Clone(w.Members), At: w.At})
	e.in.Unlock()
	e.poke()
}

// OnReports hands the engine a worker's step reports.
func (e *Engine) OnReports(worker string, steps []StepReport) {
	e.in.Lock()
	e.reports = append(e.reports, workerReports{worker, steps})
	e.in.Unlock()
	e.poke()
}

// OnStartLost tells the engine that a worker its provisioner started ended
// before it ever joined a world (it crashed while starting, its node gave up
// on it). A Grow or a Replace waiting for its workers counts it: once every
// worker it started has joined or been lost, it is over — failed when the
// world did not reach its size — and the heuristic decides again after
// failureQuiet, rather than after ActionTimeout. (The engine does not know
// which action started the worker: one lost after its action ended counts
// against the next.)
func (e *Engine) OnStartLost() {
	e.in.Lock()
	e.lost++
	e.in.Unlock()
	e.poke()
}

// heuristicReady is a Background heuristic's wake-up: it has an answer to
// collect, new steps or not.
func (e *Engine) heuristicReady() {
	e.in.Lock()
	e.ready = true
	e.in.Unlock()
	e.poke()
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run measures and decides until ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			e.progress(ctx)
		case <-e.wake:
			e.in.Lock()
			worlds, reports, notes, ready, lost := e.worlds, e.reports, e.notes, e.ready, e.lost
			e.worlds, e.reports, e.notes, e.ready, e.lost = nil, nil, nil, false, 0
			e.in.Unlock()
			if a := e.pending; a != nil && lost > 0 && (a.d.Action == Grow || a.d.Action == Replace) {
				a.lost += lost
			}
			for _, ev := range notes {
				e.emit(ev)
			}
			for _, w := range worlds {
				e.onWorld(w)
			}
			for _, r := range reports {
				e.onReports(r)
			}
			if len(worlds) > 0 || lost > 0 {
				e.progress(ctx)
			}
			e.evaluate(ctx, ready)
		}
	}
}

// maxStepsPerPeriod bounds the steps a period keeps: older ones are dropped
// (measurements then describe the recent steps, which is what matters).
const maxStepsPerPeriod = 4096

// maxStepsKept bounds the steps the whole history keeps, so that a job
// whose world changes often holds no more than one whose world never
// changes: past the bound, the oldest periods give up their steps (each
// keeping its measurement, Period.Measure).
const maxStepsKept = maxStepsPerPeriod

func (e *Engine) onWorld(w WorldChange) {
	e.mu.Lock()
	if cur := e.history.Current(); cur != nil {
		cur.End = w.At
	}
	if e.history.Start.IsZero() {
		e.history.Start = w.At
	}
	p := &Period{Epoch: w.Epoch, Members: w.Members, Start: w.At, Skip: e.cfg.Skip}
	e.history.Periods = append(e.history.Periods, p)
	e.periods[w.Epoch] = p
	e.partial[w.Epoch] = map[int64]*partialStep{}
	// Reports of a world's last steps may still arrive just after the next
	// world forms; older worlds' unfinished steps will never complete.
	// (Epoch numbers can jump when a worker takes over proposing.)
	prev := uint64(0)
	if n := len(e.history.Periods); n >= 2 {
		prev = e.history.Periods[n-2].Epoch
	}
	for ep := range e.partial {
		if ep != w.Epoch && ep != prev {
			delete(e.partial, ep)
			delete(e.periods, ep)
		}
	}
	// Flags raised in the old world are stale: shares of the batch change.
	e.flags = nil
	e.mu.Unlock()
	e.emit(Event{Kind: EventWorld, Message: fmt.Sprintf("world epoch %d: %d workers", w.Epoch, len(w.Members))})
}

func (e *Engine) onReports(r workerReports) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range r.steps {
		p, steps := e.periods[s.Epoch], e.partial[s.Epoch]
		if p == nil || steps == nil || p.dropped || !slices.Contains(p.Members, r.worker) {
			continue // not a member of that world, or a world long gone
		}
		if s.TotalSteps > 0 && e.cfg.TotalSteps == 0 {
			e.history.TotalSteps = s.TotalSteps
		}
		ps := steps[s.Step]
		if ps == nil {
			ps = &partialStep{samples: map[string]int{}, compute: map[string]time.Duration{}, times: map[string]time.Duration{}}
			steps[s.Step] = ps
		}
		ps.samples[r.worker], ps.compute[r.worker], ps.times[r.worker] = s.Samples, s.Compute, s.StepTime
		ps.accum = max(ps.accum, s.Accum)
		if s.GradVar > 0 {
			ps.gradSqr, ps.gradVar = s.GradSqr, s.GradVar
		}
		if len(ps.times) < len(p.Members) {
			continue
		}
		delete(steps, s.Step)
		st := StepStats{Step: s.Step, Compute: ps.compute, Samples: ps.samples, Accum: ps.accum, GradSqr: ps.gradSqr, GradVar: ps.gradVar}
		var total time.Duration
		for _, w := range p.Members {
			st.GlobalBatch += ps.samples[w]
			total += ps.times[w]
		}
		st.Time = total / time.Duration(len(p.Members))
		i, _ := slices.BinarySearchFunc(p.Steps, st.Step, func(a StepStats, step int64) int { return cmpInt(a.Step, step) })
		p.Steps = slices.Insert(p.Steps, i, st)
		p.complete++
		e.kept++
		if len(p.Steps) > maxStepsPerPeriod {
			drop := len(p.Steps) - maxStepsPerPeriod/2
			p.Steps = slices.Delete(p.Steps, 0, drop)
			p.Skip = max(0, p.Skip-drop)
			e.kept -= drop
		}
		e.boundHistory()
		e.history.Step = max(e.history.Step, st.Step)
		if e.detector != nil && p == e.history.Current() {
			e.flags = append(e.flags, e.detector.Observe(p.Epoch, st.Step, st.Samples, st.Compute)...)
		}
	}
}

// boundHistory has the oldest periods give up their steps while the history
// keeps more than maxStepsKept (called with mu held). The current period
// keeps its own (maxStepsPerPeriod bounds it).
func (e *Engine) boundHistory() {
	periods := e.history.Periods
	for e.kept > maxStepsKept && e.keptFrom < len(periods)-1 {
		e.kept -= periods[e.keptFrom].dropSteps()
		e.keptFrom++
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// evaluate consults straggler detection, then the heuristic, when new steps
// are complete (or a Background heuristic has an answer) and no decision is
// being carried out.
func (e *Engine) evaluate(ctx context.Context, ready bool) {
	cur := e.history.Current()
	if cur == nil || e.pending != nil || (e.history.Step <= e.lastStep && !ready) || time.Now().Before(e.quietUntil) {
		return
	}
	e.lastStep = e.history.Step
	if d, ok := e.stragglerDecision(cur); ok {
		e.act(ctx, d)
		return
	}
	e.history.Now = time.Now()
	d, err := e.cfg.Heuristic.Decide(ctx, &e.history)
	if err == nil {
		err = d.Validate()
	}
	if err != nil {
		if msg := err.Error(); msg != e.lastError {
			e.lastError = msg
			e.emit(Event{Kind: EventError, Message: fmt.Sprintf("%s: %v (holding)", e.cfg.Heuristic.Name(), err)})
		}
		return
	}
	e.lastError = ""
	if d.Action == Hold {
		if d.Settled {
			e.emitSettled(&d)
		}
		return
	}
	e.act(ctx, d)
}

// emitSettled records, once, that the heuristic found its target: the
// decision reaching it has taken effect, or it holds where it is.
func (e *Engine) emitSettled(d *Decision) {
	if e.settled != nil {
		return
	}
	e.emit(Event{Kind: EventSettled, Decision: d, Message: fmt.Sprintf("settled at %d workers (%s)", e.history.Workers(), d.Reason)})
}

func (e *Engine) stragglerDecision(cur *Period) (Decision, bool) {
	flags := e.flags
	e.flags = nil
	if e.detector == nil || len(flags) == 0 {
		return Decision{}, false
	}
	slices.SortFunc(flags, func(a, b straggler.Flag) int {
		switch {
		case a.Relative < b.Relative:
			return -1
		case a.Relative > b.Relative:
			return 1
		}
		return 0
	})
	for _, f := range flags {
		if !slices.Contains(cur.Members, f.Worker) {
			continue
		}
		if ok, why := e.policy.Allow(f.Worker, e.history.Step); !ok {
			if !e.told[f.Worker] {
				e.told[f.Worker] = true
				e.emit(Event{Kind: EventStraggler, Message: fmt.Sprintf("straggler: %v; not replacing it: %s", f, why)})
			}
			continue
		}
		return Decision{Action: Replace, Worker: f.Worker, Reason: "straggler: " + f.String(),
			Numbers: map[string]float64{"relative_throughput": f.Relative, "threshold": e.cfg.Straggler.Threshold, "steps_below": float64(f.Below)}}, true
	}
	return Decision{}, false
}

// failed reports a decision that could not be carried out, once per distinct
// message, and holds further decisions for failureQuiet.
func (e *Engine) failed(d *Decision, msg string) {
	e.quietUntil = time.Now().Add(failureQuiet)
	if msg == e.lastFailure {
		return
	}
	e.lastFailure = msg
	e.emit(Event{Kind: EventFailed, Decision: d, Message: msg})
}

// failureQuiet is how long the engine waits after a decision failed before it
// acts on another.
const failureQuiet = 5 * time.Second

// act starts carrying out a decision.
func (e *Engine) act(ctx context.Context, d Decision) {
	cur := e.history.Current()
	k := cur.Workers()
	before := map[string]bool{}
	for _, m := range cur.Members {
		before[m] = true
	}
	a := &action{d: d, started: time.Now(), before: before}
	switch d.Action {
	case Grow:
		a.target = e.history.Clamp(k + d.Count)
		n := a.target - k
		if n <= 0 {
			e.failed(&d, fmt.Sprintf("cannot grow: %d workers is the maximum", k))
			return
		}
		d.Count = n
		e.emit(Event{Kind: EventDecision, Decision: &d, Message: fmt.Sprintf("grow %d → %d workers: %s", k, a.target, d.Reason)})
		if err := e.prov.Start(ctx, n); err != nil {
			e.failed(&d, fmt.Sprintf("starting %d workers: %v", n, err))
			return
		}
	case Shrink:
		target := e.history.Clamp(k - d.Count)
		n := k - target
		if n <= 0 {
			e.failed(&d, fmt.Sprintf("cannot shrink: %d workers is the minimum", k))
			return
		}
		d.Count = n
		e.emit(Event{Kind: EventDecision, Decision: &d, Message: fmt.Sprintf("shrink %d → %d workers: %s", k, target, d.Reason)})
		// The newest workers go: rank 0, which joiners copy their state
		// from, stays, and so do the ranks of everyone else.
		a.victims = e.infos(cur.Members[target:])
		for name := range a.victims {
			e.cluster.Remove(name)
		}
	case Replace:
		if !before[d.Worker] {
			e.failed(&d, fmt.Sprintf("cannot replace %s: not in the world", d.Worker))
			return
		}
		a.old = d.Worker
		e.emit(Event{Kind: EventDecision, Decision: &d, Message: fmt.Sprintf("replace %s: %s", d.Worker, d.Reason)})
		if err := e.prov.Start(ctx, 1); err != nil {
			e.failed(&d, fmt.Sprintf("starting a replacement: %v", err))
			return
		}
	}
	a.d = d // with the count clamped to the bounds
	e.lastFailure = ""
	e.setPending(a)
}

// countReplacement counts a straggler replaced (under mu: Summary reads it).
func (e *Engine) countReplacement() {
	e.mu.Lock()
	e.replaced++
	e.mu.Unlock()
}

func (e *Engine) setPending(a *action) {
	e.mu.Lock()
	e.pending = a
	e.mu.Unlock()
}

// infos finds the named workers' process information.
func (e *Engine) infos(names []string) map[string]WorkerInfo {
	known := map[string]WorkerInfo{}
	for _, w := range e.cluster.Workers() {
		known[w.Name] = w
	}
	out := map[string]WorkerInfo{}
	for _, n := range names {
		w, ok := known[n]
		if !ok {
			w = WorkerInfo{Name: n}
		}
		out[n] = w
	}
	return out
}

// progress follows the decision being carried out.
func (e *Engine) progress(ctx context.Context) {
	a := e.pending
	cur := e.history.Current()
	if a == nil || cur == nil {
		return
	}
	took := time.Since(a.started).Round(time.Millisecond)
	done := func(msg string) {
		e.setPending(nil)
		e.emit(Event{Kind: EventDone, Decision: &a.d, Message: fmt.Sprintf("%s after %v", msg, took)})
		if a.d.Settled {
			e.emitSettled(&a.d)
		}
	}
	gone := func() bool {
		for name := range a.victims {
			if slices.Contains(cur.Members, name) {
				return false
			}
		}
		return true
	}
	stop := func() {
		for _, w := range a.victims {
			go func() {
				sctx, cancel := context.WithTimeout(ctx, e.cfg.ActionTimeout)
				defer cancel()
				if err := e.prov.Stop(sctx, w); err != nil && sctx.Err() == nil {
					e.in.Lock()
					e.notes = append(e.notes, Event{Kind: EventFailed, Message: fmt.Sprintf("stopping %s: %v", w.Name, err)})
					e.in.Unlock()
					e.poke()
				}
			}()
		}
	}
	switch a.d.Action {
	case Grow:
		if cur.Workers() >= a.target {
			done(fmt.Sprintf("world grew to %d workers", cur.Workers()))
			return
		}
		// Workers that left meanwhile (preempted, lost) keep the world
		// below the target however many join: once as many have joined
		// as were started, the decision is carried out, and the policy
		// judges the world as it now is.
		joined, left := 0, 0
		for _, m := range cur.Members {
			if !a.before[m] {
				joined++
			}
		}
		for m := range a.before {
			if !slices.Contains(cur.Members, m) {
				left++
			}
		}
		if left > 0 && joined >= a.d.Count {
			done(fmt.Sprintf("%d workers joined, %d left meanwhile: the world has %d", joined, left, cur.Workers()))
			return
		}
		if a.lost > 0 && joined+a.lost >= a.d.Count {
			e.setPending(nil)
			e.failed(&a.d, fmt.Sprintf("%d of the %d workers started were lost before they joined; the world has %d workers", min(a.lost, a.d.Count), a.d.Count, cur.Workers()))
			return
		}
	case Shrink:
		if gone() {
			stop()
			done(fmt.Sprintf("world shrank to %d workers", cur.Workers()))
			return
		}
	case Replace:
		if a.joined == "" && a.lost > 0 {
			e.setPending(nil)
			e.failed(&a.d, fmt.Sprintf("the replacement for %s was lost before it joined", a.old))
			return
		}
		if a.joined == "" {
			for _, m := range cur.Members {
				if !a.before[m] {
					a.joined = m
				}
			}
			if a.joined != "" {
				if !slices.Contains(cur.Members, a.old) {
					// The straggler left by itself meanwhile.
					e.policy.Replaced(a.old, a.joined, e.history.Step)
					e.countReplacement()
					done(fmt.Sprintf("%s joined; %s had already left", a.joined, a.old))
					return
				}
				a.victims = e.infos([]string{a.old})
				e.cluster.Remove(a.old)
				e.emit(Event{Kind: EventStraggler, Message: fmt.Sprintf("replacement %s is in the world; removing %s", a.joined, a.old)})
			}
		}
		if a.joined != "" && gone() {
			e.policy.Replaced(a.old, a.joined, e.history.Step)
			e.countReplacement()
			stop()
			done(fmt.Sprintf("%s replaced by %s", a.old, a.joined))
			return
		}
	}
	if took > e.cfg.ActionTimeout {
		if a.d.Action == Shrink || a.joined != "" {
			stop() // removed from the job: their processes must still end
		}
		e.setPending(nil)
		e.emit(Event{Kind: EventFailed, Decision: &a.d, Message: fmt.Sprintf("not carried out within %v; the world has %d workers", e.cfg.ActionTimeout, cur.Workers())})
	}
}

func (e *Engine) emit(ev Event) {
	e.mu.Lock()
	ev.Time = time.Now()
	if !e.history.Start.IsZero() {
		ev.Elapsed = ev.Time.Sub(e.history.Start).Seconds()
	}
	ev.Step = e.history.Step
	if cur := e.history.Current(); cur != nil {
		ev.Workers, ev.Epoch = cur.Workers(), cur.Epoch
	}
	if ev.Kind == EventSettled && e.settled == nil {
		e.settled = &ev
	}
	if ev.Kind != EventWorld {
		e.events = append(e.events, ev)
	}
	e.mu.Unlock()
	if e.cfg.OnEvent != nil {
		e.cfg.OnEvent(ev)
	}
}
