package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorovod/gorovod/cluster/scheduler"
	"github.com/gorovod/gorovod/cluster/steer"
	"github.com/gorovod/gorovod/job"
)

// ErrInvalidConfig is wrapped by every error about a Config that cannot run.
var ErrInvalidConfig = errors.New("pool: invalid configuration")

// Config describes a pool and its jobs. A zero field means its default.
type Config struct {
	// Jobs are the jobs to run (required).
	Jobs []JobSpec
	// Slots is how many workers the pool runs at once (required).
	Slots int
	// SlotsPerNode is how many slots make a machine, for the policy's
	// placement and the goodput models (default Slots: one machine).
	SlotsPerNode int
	// Policy shares the slots. Default Pollux with a restart penalty of
	// RestartPenalty.
	Policy scheduler.Policy
	// RestartPenalty is Pollux's δ for the default policy: what a resize
	// costs a job (gorovod resizes a running job live). Default 2 s.
	RestartPenalty time.Duration
	// Interval is the time between scheduling rounds (default 10 s); a
	// round also runs when a job arrives or ends.
	Interval time.Duration
	// Job is every job's template: Launcher, Discovery, Gossip, Env,
	// timeouts, Logger and Sinks are taken from it; Argv, Workers,
	// MinWorkers, MaxWorkers, JobID and the autoscaling heuristic are the
	// pool's.
	Job job.Config
	// OnRound receives the pool's state after every round (a live table).
	OnRound func(Round)
	// Logger receives the pool's notices (a job that failed to start).
	// Default: discarded.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults; Jobs and Slots must still be set.
func DefaultConfig() Config {
	return Config{Interval: 10 * time.Second, RestartPenalty: 2 * time.Second, Job: job.DefaultConfig()}
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Slots < 1 || c.Slots > 255 {
		return c, fmt.Errorf("%w: %d slots (want 1 to 255)", ErrInvalidConfig, c.Slots)
	}
	if c.SlotsPerNode == 0 {
		c.SlotsPerNode = c.Slots
	}
	if c.SlotsPerNode < 1 || c.Slots%c.SlotsPerNode != 0 {
		return c, fmt.Errorf("%w: %d slots per node does not divide %d slots", ErrInvalidConfig, c.SlotsPerNode, c.Slots)
	}
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.RestartPenalty == 0 {
		c.RestartPenalty = d.RestartPenalty
	}
	if c.Interval < 0 || c.RestartPenalty < 0 {
		return c, fmt.Errorf("%w: negative interval or restart penalty", ErrInvalidConfig)
	}
	if c.Policy == nil {
		c.Policy = scheduler.NewPollux(scheduler.PolluxConfig{RestartPenalty: c.RestartPenalty})
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validateSpecs(c.Jobs, c.Slots); err != nil {
		return c, err
	}
	return c, nil
}

// State is where a job of the pool is.
type State string

const (
	Waiting State = "waiting" // not submitted yet
	Queued  State = "queued"  // submitted, no slots yet
	Running State = "running"
	Done    State = "done"   // trained to its end
	Failed  State = "failed" // could not start, or its job failed
)

// JobStatus is a job of the pool as a round left it.
type JobStatus struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Allocated is the slots the pool gives the job; Workers the members of
	// its current world (they differ while it resizes).
	Allocated int `json:"allocated"`
	Workers   int `json:"workers"`
	// Step and TotalSteps are the job's progress (TotalSteps 0: unknown).
	Step       int64 `json:"step"`
	TotalSteps int64 `json:"total_steps,omitempty"`
	// Throughput is measured in the current world (samples/s, or steps/s
	// when the trainer reports no samples); Goodput is the fitted model's
	// prediction at the allocation (0 while there is no model).
	Throughput float64 `json:"throughput"`
	Goodput    float64 `json:"goodput"`
	// Profiled is the largest world size the model was fitted at.
	Profiled int `json:"profiled,omitempty"`
	// GradSqr and GradVar are the gradient statistics the trainer reports
	// (0: none; the model then assumes statistical efficiency 1).
	GradSqr float64 `json:"grad_sqr,omitempty"`
	GradVar float64 `json:"grad_var,omitempty"`
	// Resizes counts the allocation changes of the running job.
	Resizes int `json:"resizes"`
	// Submitted, Started and Finished are seconds since the pool started
	// (Started and Finished 0 until then); JCT is Finished − Submitted.
	Submitted float64 `json:"submitted_s"`
	Started   float64 `json:"started_s,omitempty"`
	Finished  float64 `json:"finished_s,omitempty"`
	JCT       float64 `json:"jct_s,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// Round is the pool after a scheduling round.
type Round struct {
	Round   int         `json:"round"`
	Elapsed float64     `json:"elapsed_s"`
	Policy  string      `json:"policy"`
	Slots   int         `json:"slots"`
	Used    int         `json:"allocated"`
	Jobs    []JobStatus `json:"jobs"`
}

// Result is how the pool's run went.
type Result struct {
	Policy string      `json:"policy"`
	Slots  int         `json:"slots"`
	Rounds int         `json:"rounds"`
	Jobs   []JobStatus `json:"jobs"`
	// AvgJCT is the mean job completion time of the jobs that finished,
	// Makespan the time until the last one ended (seconds).
	AvgJCT   float64 `json:"avg_jct_s"`
	Makespan float64 `json:"makespan_s"`
	// SlotUtilization is the allocated slot-time over the pool's slot-time
	// until the makespan.
	SlotUtilization float64 `json:"slot_utilization"`
}

// entry is one job of the pool.
type entry struct {
	spec     JobSpec
	state    State
	steer    *steer.Steer
	job      *job.Job
	alloc    []int         // the nodes of its slots
	attained time.Duration // slot-time held
	resizes  int
	started  time.Duration
	finished time.Duration
	err      error
}

// ended is a job's end, from the goroutine waiting on it.
type ended struct {
	i   int
	out job.Outcome
	err error
}

type pool struct {
	cfg     Config
	cluster scheduler.Cluster
	jobs    []*entry
	start   time.Time
	last    time.Duration // the previous round
	rounds  int
	used    time.Duration // slot-time allocated
	ends    chan ended
	running int
}

// Run runs the jobs on the pool to their ends and returns how it went. When
// ctx ends, the running jobs are stopped, and Run returns once they have
// ended, with ctx's error.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	p := &pool{cfg: cfg, start: time.Now(), ends: make(chan ended, len(cfg.Jobs))}
	p.cluster = scheduler.NewCluster(cfg.Slots/cfg.SlotsPerNode, cfg.SlotsPerNode)
	for _, s := range cfg.Jobs {
		p.jobs = append(p.jobs, &entry{spec: s, state: Waiting})
	}
	jobsCtx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		if err := p.round(ctx, jobsCtx); err != nil {
			stopJobs()
			p.drain()
			return p.result(), err
		}
		if p.over() {
			return p.result(), nil
		}
		tick.Reset(cfg.Interval) // the next round is an interval after this one
		arrival := time.NewTimer(p.nextArrival())
		select {
		case <-ctx.Done():
			arrival.Stop()
			stopJobs()
			p.drain()
			return p.result(), ctx.Err()
		case <-tick.C:
		case <-arrival.C:
		case e := <-p.ends:
			p.record(e)
		}
		arrival.Stop()
	}
}

// now is the time since the pool started.
func (p *pool) now() time.Duration { return time.Since(p.start) }

// over says every job has ended.
func (p *pool) over() bool {
	for _, e := range p.jobs {
		if e.state != Done && e.state != Failed {
			return false
		}
	}
	return true
}

// nextArrival is the time until the next job arrives (an hour when none is
// left to arrive: the ticker and the ends wake the loop).
func (p *pool) nextArrival() time.Duration {
	next := time.Hour
	now := p.now()
	for _, e := range p.jobs {
		if e.state == Waiting {
			next = min(next, max(e.spec.Submit-now, time.Millisecond))
		}
	}
	return next
}

// drain waits for the running jobs to end (after their context ended).
func (p *pool) drain() {
	for p.running > 0 {
		p.record(<-p.ends)
	}
}

// record takes note of a job's end.
func (p *pool) record(x ended) {
	e := p.jobs[x.i]
	p.running--
	e.finished = p.now()
	e.state, e.err = Done, x.err
	if x.err != nil || !x.out.TrainingFinished {
		e.state = Failed
		if e.err == nil {
			e.err = errors.New("the job ended before training finished")
		}
		p.cfg.Logger.Warn("job failed", "job", e.spec.Name, "err", e.err)
	}
	p.charge(e)
	e.alloc = nil
}

// charge adds a job's slot-time since the last round.
func (p *pool) charge(e *entry) {
	held := time.Duration(len(e.alloc)) * (p.now() - p.last)
	e.attained += held
	p.used += held
}

// round is one scheduling round: arrivals, ends, the policy's allocation and
// carrying it out.
func (p *pool) round(ctx, jobsCtx context.Context) error {
	for more := true; more; {
		select {
		case x := <-p.ends:
			p.record(x)
		default:
			more = false
		}
	}
	now := p.now()
	var active []*entry
	for _, e := range p.jobs {
		if e.state == Waiting && e.spec.Submit <= now {
			e.state = Queued
		}
		if e.state == Running {
			p.charge(e)
		}
		if e.state == Queued || e.state == Running {
			active = append(active, e)
		}
	}
	p.last = now
	if len(active) > 0 {
		if err := p.allocate(ctx, jobsCtx, now, active); err != nil {
			return err
		}
	}
	p.rounds++
	if p.cfg.OnRound != nil {
		r := Round{Round: p.rounds, Elapsed: now.Seconds(), Policy: p.cfg.Policy.Name(), Slots: p.cfg.Slots}
		for _, e := range p.jobs {
			s := p.status(e)
			r.Used += s.Allocated
			r.Jobs = append(r.Jobs, s)
		}
		p.cfg.OnRound(r)
	}
	return nil
}

// allocate asks the policy and carries out its allocation.
func (p *pool) allocate(ctx, jobsCtx context.Context, now time.Duration, active []*entry) error {
	jobs := make([]scheduler.Job, len(active))
	current := scheduler.Allocation{}
	for i, e := range active {
		jobs[i] = p.describe(e)
		if len(e.alloc) > 0 {
			current[e.spec.Name] = e.alloc
		}
	}
	proposed, err := p.cfg.Policy.Allocate(ctx, now, jobs, p.cluster, current)
	if err != nil {
		return fmt.Errorf("pool: %s: %w", p.cfg.Policy.Name(), err)
	}
	want := make([]int, len(active))
	floor := make([]int, len(active))
	running := make([]bool, len(active))
	for i, e := range active {
		want[i] = min(len(proposed[e.spec.Name]), p.maxWorkers(e))
		floor[i] = max(e.spec.MinWorkers, 1)
		running[i] = e.state == Running
	}
	scheduler.RepairToMinimums(want, floor, running, p.cfg.Slots)
	counts := make(map[string]int, len(active))
	ids := make([]string, len(active))
	for i, e := range active {
		counts[e.spec.Name] = want[i]
		ids[i] = e.spec.Name
	}
	placed := scheduler.PlaceCounts(p.cluster, ids, counts, proposed, current, nil, nil, nil)

	// Shrinks first, so that their slots are on their way back when the
	// growing jobs' workers start; then grows; then first starts.
	for _, phase := range []func(e *entry, n int) bool{
		func(e *entry, n int) bool { return e.state == Running && n < len(e.alloc) },
		func(e *entry, n int) bool { return e.state == Running && n > len(e.alloc) },
		func(e *entry, n int) bool { return e.state == Queued && n > 0 },
	} {
		for _, e := range active {
			n := len(placed[e.spec.Name])
			if !phase(e, n) {
				continue
			}
			if e.state == Queued {
				p.startJob(jobsCtx, e, placed[e.spec.Name])
				continue
			}
			e.resizes++
			e.alloc = placed[e.spec.Name]
			e.steer.SetTarget(n)
		}
	}
	for _, e := range active {
		if e.state == Running && len(placed[e.spec.Name]) == len(e.alloc) {
			e.alloc = placed[e.spec.Name] // same size, maybe other nodes: the policy's view
		}
	}
	return nil
}

func (p *pool) maxWorkers(e *entry) int {
	if e.spec.MaxWorkers > 0 {
		return min(e.spec.MaxWorkers, p.cfg.Slots)
	}
	return p.cfg.Slots
}

// startJob starts a queued job on its first slots.
func (p *pool) startJob(ctx context.Context, e *entry, nodes []int) {
	n := len(nodes)
	e.steer = steer.New(steer.Config{Target: n, InitBatch: e.spec.InitBatch, WorkersPerNode: p.cfg.SlotsPerNode, FitEvery: time.Second, Allocator: "the pool"})
	cfg := p.cfg.Job
	cfg.Argv = e.spec.Argv
	cfg.Env = slices.Concat(p.cfg.Job.Env, e.spec.Env)
	cfg.Workers, cfg.MinWorkers, cfg.MaxWorkers = n, max(e.spec.MinWorkers, 1), p.maxWorkers(e)
	cfg.JobID = ""
	cfg.Autoscaling.Heuristic = e.steer
	cfg.Autoscaling.ReplaceStragglers = false
	j, err := job.Start(ctx, cfg)
	if err != nil {
		e.state, e.err, e.finished = Failed, err, p.now()
		p.cfg.Logger.Warn("job did not start", "job", e.spec.Name, "err", err)
		return
	}
	e.job, e.state, e.alloc, e.started = j, Running, nodes, p.now()
	p.running++
	i := slices.Index(p.jobs, e)
	go func() {
		out, err := j.Wait()
		p.ends <- ended{i: i, out: out, err: err}
	}()
}

// describe is what the policy knows of a job.
func (p *pool) describe(e *entry) scheduler.Job {
	sj := scheduler.Job{ID: e.spec.Name, Submitted: e.spec.Submit, Attained: e.attained, Restarts: e.resizes,
		MinReplicas: max(e.spec.MinWorkers, 1), MaxReplicas: p.maxWorkers(e), Replicas: max(e.spec.Workers, e.spec.MinWorkers, 1)}
	var f steer.Fitted
	var st struct{ step, total int64 }
	if e.steer != nil {
		f = e.steer.Model()
		s := e.job.Status()
		st.step, st.total = s.Step, s.TotalSteps
	}
	sj.MaxProfiledReplicas = f.MaxProfiled
	sj.RemainingSteps = 1
	if st.total > 0 {
		sj.RemainingSteps = float64(max(st.total-st.step, 0))
	}
	if f.OK {
		sj.Goodput = scheduler.ModelGoodput(f.Model, e.spec.Limits)
		sj.StepTime = scheduler.ModelStepTime(f.Model, p.cfg.SlotsPerNode)
	} else {
		sj.StepTime = func(r int) float64 { return 1 / float64(max(r, 1)) } // unmeasured: perfect scaling
	}
	return sj
}

// status describes a job now.
func (p *pool) status(e *entry) JobStatus {
	s := JobStatus{Name: e.spec.Name, State: e.state, Allocated: len(e.alloc), Resizes: e.resizes, Submitted: e.spec.Submit.Seconds()}
	if e.started > 0 {
		s.Started = e.started.Seconds()
	}
	if e.state == Done || e.state == Failed {
		s.Finished = e.finished.Seconds()
		if e.state == Done {
			s.JCT = (e.finished - e.spec.Submit).Seconds()
		}
	}
	if e.err != nil {
		s.Err = e.err.Error()
	}
	if e.job == nil {
		return s
	}
	st := e.job.Status()
	s.Workers, s.Step, s.TotalSteps, s.Throughput = st.Workers, st.Step, st.TotalSteps, st.Throughput
	if e.state != Running {
		s.Workers = 0
	}
	f := e.steer.Model()
	s.Profiled = f.MaxProfiled
	if f.Grad {
		s.GradSqr, s.GradVar = f.Model.Grad.Sqr, f.Model.Grad.Var
	}
	if f.OK && len(e.alloc) > 0 {
		s.Goodput = scheduler.ModelGoodput(f.Model, e.spec.Limits)(nodesOf(e.alloc), len(e.alloc))
	}
	return s
}

// result sums the run up.
func (p *pool) result() Result {
	r := Result{Policy: p.cfg.Policy.Name(), Slots: p.cfg.Slots, Rounds: p.rounds}
	var sum float64
	var n int
	for _, e := range p.jobs {
		s := p.status(e)
		r.Jobs = append(r.Jobs, s)
		if s.State == Done {
			sum += s.JCT
			n++
		}
		r.Makespan = max(r.Makespan, s.Finished)
	}
	if n > 0 {
		r.AvgJCT = sum / float64(n)
	}
	if r.Makespan > 0 {
		r.SlotUtilization = p.used.Seconds() / (r.Makespan * float64(p.cfg.Slots))
	}
	return r
}

// nodesOf is how many machines a node list spans.
func nodesOf(nodes []int) int {
	seen := map[int]bool{}
	for _, n := range nodes {
		seen[n] = true
	}
	return len(seen)
}
