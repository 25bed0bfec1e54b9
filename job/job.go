package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/observe/timeline"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// ErrNoSlot is returned when a worker is to be added but every host's slots
// are taken.
var ErrNoSlot = errors.New("job: no free slot on any host")

// ErrEnded is returned when a worker is to be added to a job whose processes
// have all exited.
var ErrEnded = errors.New("job: the job has ended")

// LimitError refuses to add workers beyond Config.MaxWorkers.
type LimitError struct {
	Workers int // the workers the driver knows of now
	Max     int
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("job: already %d workers (at most %d)", e.Workers, e.Max)
}

// Job is a running elastic job: its driver, its worker processes and its
// autoscaling engine.
type Job struct {
	cfg         Config
	driver      Driver
	engine      *heuristics.Engine
	workCtx     context.Context // the processes' context: ending it stops them
	stopWorkers context.CancelFunc
	stopEngine  context.CancelFunc
	stopHosts   context.CancelFunc
	engineDone  chan struct{}
	jobFile     string
	env         []string // every worker's job entries
	localHost   string

	emitMu sync.Mutex // one Sink call at a time

	mu        sync.Mutex
	procs     []*proc          // by launch index; nil for a launch that failed
	byName    map[string]*proc // member name → process, as the driver reports them
	place     placement
	hostsSeen chan struct{}  // closed at the first host list
	running   int            // processes launched or being launched, not exited
	ended     bool           // every process has exited: no more can be added
	worlds    []epoch.World  // proposed, not yet handled by supervise
	dropped   []string       // hosts the Discovery dropped, not yet handled
	share     map[string]int // workers started on each host with the job

	// Rule 6 (rejoin.go) and the floor at MinWorkers (minimum.go).
	trainingOver bool          // a member reported the end of training
	draining     bool          // LeaveAll: every worker was asked to leave
	anyFailed    bool          // a worker failed: the job fails, nothing is replaced
	strikes      int           // replacements lost before they entered a world, in a row
	toReplace    int           // workers lost and not replaced yet (Config.ReplaceLost)
	floorPoke    chan struct{} // keepMinimum looks at once

	// The start (start.go).
	firstWorld    chan struct{} // closed at the first world
	firstOnce     sync.Once
	firstPoke     chan struct{} // awaitFirstWorld looks again
	startTimedOut bool          // the first world did not wait for all the first workers (under mu)

	poke      chan struct{}
	allExited chan struct{}
	lastStep  atomic.Int64

	queue    *laterQueue        // events raised on the driver's goroutine
	stalls   *stallWatch        // the driver's half of the stall inspector
	timeline *timeline.Timeline // the driver's part of Config.Timeline
	record   *jobRecord         // Config.OutputDir's record.tsv; nil without it
	byHand   []string           // members that joined without being launched (under mu)

	done    chan struct{}
	outcome Outcome
	err     error
}

// proc is a worker process of the job.
type proc struct {
	rec     WorkerRecord
	p       Process
	stopped bool // stopped by the runner (end-of-job rule 3)

	// Rule 6 (rejoin.go).
	removed     bool            // taken out by the autoscaling engine
	leaving     map[string]bool // member names it published as leaving
	out         bool            // left out of a world, not back yet
	everIn      bool            // one of its names was a member of a world
	replacement bool            // started by the floor (keepMinimum)
	forEngine   bool            // started by the autoscaling engine (provisioner.Start)
}

// Run runs a job to its end: Start, then Wait.
func Run(ctx context.Context, cfg Config) (Outcome, error) {
	j, err := Start(ctx, cfg)
	if err != nil {
		return Outcome{}, err
	}
	return j.Wait()
}

// Start starts the job's driver and its first workers and returns while they
// run. ctx bounds the whole job: when it ends, the workers are stopped and
// the job ends.
func Start(ctx context.Context, cfg Config) (*Job, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	localHost, _ := os.Hostname()
	j := &Job{cfg: cfg, localHost: localHost, byName: map[string]*proc{},
		place:     placement{running: map[string]int{}},
		hostsSeen: make(chan struct{}), poke: make(chan struct{}, 1), floorPoke: make(chan struct{}, 1),
		firstWorld: make(chan struct{}), firstPoke: make(chan struct{}, 1),
		allExited: make(chan struct{}), engineDone: make(chan struct{}), done: make(chan struct{}),
		queue: newLaterQueue(), stalls: newStallWatch(cfg.StallCheck)}
	ecfg := cfg.Autoscaling
	ecfg.OnEvent = func(ev heuristics.Event) { j.emit(Autoscaling{ev}) }
	if j.engine, err = heuristics.NewEngine(ecfg, cluster{j}, provisioner{j}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.OutputDir != "" {
		if j.record, err = openJobRecord(cfg.OutputDir, cfg.JobID); err != nil {
			return nil, err
		}
	}
	if cfg.Timeline != "" {
		if j.timeline, err = openDriverTimeline(cfg.Timeline, cfg.JobID); err != nil {
			j.record.close()
			return nil, err
		}
		j.cfg.Sinks = append(slices.Clone(cfg.Sinks), driverTimeline{j.timeline})
	}
	go j.deliverLater()

	startCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	j.driver, err = cfg.StartDriver(startCtx, driver.Config{
		JobID: cfg.JobID, Secret: cfg.Secret, MinWorkers: cfg.Workers, Membership: cfg.Gossip, // start.go
		Logger: cfg.Logger, OnEpoch: j.onEpoch, OnStats: j.onStats, OnStall: j.onStall,
	})
	if err != nil {
		j.flushLater()
		j.mergeTimeline()
		j.record.close()
		return nil, err
	}
	fail := func(err error) (*Job, error) {
		j.stopWorkers()
		j.waitLaunched()
		j.stopHosts()
		_ = j.driver.Close()
		j.flushLater()
		j.mergeTimeline()
		j.record.close()
		if j.jobFile != "" {
			os.Remove(j.jobFile)
		}
		return nil, err
	}
	j.workCtx, j.stopWorkers = context.WithCancel(ctx)
	var hostsCtx context.Context
	hostsCtx, j.stopHosts = context.WithCancel(context.Background())
	go j.discover(hostsCtx)
	select {
	case <-j.hostsSeen:
	case <-startCtx.Done():
		return fail(fmt.Errorf("job: no host list from the discovery: %w", startCtx.Err()))
	}

	// The job's minimum goes to every worker: one that takes over proposing
	// (the driver out of its view for a while) must not form a smaller world.
	j.env = envconfig.ElasticWorker{JobID: cfg.JobID, Secret: cfg.Secret, Seeds: []string{j.driver.GossipAddr()}, MinWorkers: cfg.MinWorkers}.Environ()
	j.env = append(j.env, cfg.observabilityEnv()...)
	if cfg.JobFile {
		sweepJobFiles(os.TempDir(), cfg.Logger)
		if j.jobFile, err = writeJobFile(os.TempDir(), j.env); err != nil {
			return fail(err)
		}
	}

	// Place the first workers, then launch them: the hosts in parallel, each
	// host's workers one after another in launch order (so that a host's
	// devices go to its workers in ring order).
	j.mu.Lock()
	type slot struct {
		index int
		host  string
	}
	slots := make([]slot, cfg.Workers)
	share := map[string]int{}
	for i := range slots {
		h, ok := j.place.pick()
		if !ok {
			j.mu.Unlock()
			return fail(fmt.Errorf("%w: %d workers, but the hosts have slots for %d", ErrNoSlot, cfg.Workers, i))
		}
		slots[i] = slot{j.reserveLocked(h), h}
		share[h]++
	}
	j.share = share
	j.mu.Unlock()
	started := make([]WorkerRef, len(slots))
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for host := range share {
		wg.Go(func() {
			for i, s := range slots {
				if s.host == host {
					started[i], errs[i] = j.launch(s.index, s.host, share[s.host])
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}

	launched := time.Now()
	j.emit(JobStarted{At: now(), JobID: cfg.JobID, DriverAddr: j.driver.GossipAddr(), JobFile: j.jobFile, Workers: cfg.Workers})
	for _, w := range started {
		j.emit(WorkerStarted{At: now(), Worker: w, Initial: true})
	}
	var engineCtx context.Context
	engineCtx, j.stopEngine = context.WithCancel(ctx)
	go func() {
		defer close(j.engineDone)
		_ = j.engine.Run(engineCtx)
	}()
	go j.supervise()
	go j.keepMinimum(engineCtx)               // minimum.go
	go j.awaitFirstWorld(engineCtx, launched) // start.go
	return j, nil
}

// ID is the job's id.
func (j *Job) ID() string { return j.cfg.JobID }

// DriverAddr is the gossip address workers join the job through.
func (j *Job) DriverAddr() string { return j.driver.GossipAddr() }

// JobFile is the path of the job file (Config.JobFile), or "".
func (j *Job) JobFile() string { return j.jobFile }

// Environ is what a worker started by hand needs in its environment to join
// (the job file's contents). It holds the job secret.
func (j *Job) Environ() []string { return slices.Clone(j.env) }

// World is the newest world the driver proposed.
func (j *Job) World() epoch.World { return j.driver.Current() }

// Status is the autoscaling engine's view of the job now (for a progress
// display).
func (j *Job) Status() heuristics.Status { return j.engine.Status() }

// Workers describes every worker process the runner launched, by launch
// index.
func (j *Job) Workers() []WorkerRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]WorkerRecord, 0, len(j.procs))
	for _, p := range j.procs {
		if p != nil {
			out = append(out, p.rec)
		}
	}
	return out
}

// AddWorkers launches n more workers, which join the job by themselves. It
// refuses with a *LimitError beyond Config.MaxWorkers (counting the running
// processes of the job, joined or not, and the workers started by hand that
// the driver knows of), ErrNoSlot when the hosts are full and ErrEnded once
// the job has ended.
func (j *Job) AddWorkers(ctx context.Context, n int) error {
	if err := j.roomFor(n); err != nil {
		return err
	}
	return j.add(ctx, n, startedByHand)
}

// roomFor says whether n more workers fit under Config.MaxWorkers (a
// *LimitError when not).
func (j *Job) roomFor(n int) error {
	if max := j.cfg.MaxWorkers; max > 0 {
		if count := j.count(); count+n > max {
			return &LimitError{Workers: count, Max: max}
		}
	}
	return nil
}

// LeaveAll asks every running worker to leave the job gracefully
// (LeaveSignal: each trains on until its leave notice runs out or the others
// have moved on, and leaves at a committed step), and starts no worker after
// it: the job ends when they have gone. It is what a job preempted as a
// whole does (`gorovod run` under SIGTERM: a Slurm time limit or
// preemption, a Kubernetes eviction of the driver). Cancelling the job's
// context still stops them at once.
func (j *Job) LeaveAll() {
	var procs []Process
	j.mu.Lock()
	j.draining = true
	for _, p := range j.procs {
		if p != nil && p.rec.State == Running {
			procs = append(procs, p.p)
		}
	}
	j.mu.Unlock()
	for _, p := range procs {
		_ = p.Signal(LeaveSignal)
	}
}

// count is how many workers the job has: its processes still running (or
// starting) and the hand-started workers in the driver's view.
func (j *Job) count() int {
	ws := j.driver.Workers()
	j.mu.Lock()
	defer j.mu.Unlock()
	n := j.running
	for _, w := range ws {
		if j.matchLocked(w) == nil {
			n++
		}
	}
	return n
}

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for the job to end and returns its outcome, and the outcome's
// error (Outcome.Err) when the job failed.
func (j *Job) Wait() (Outcome, error) {
	<-j.done
	return j.outcome, j.err
}

// startedBy says who asked for a worker the job adds.
type startedBy int

const (
	startedByHand   startedBy = iota // AddWorkers
	startedByEngine                  // the autoscaling engine (provisioner.Start)
	startedByFloor                   // keepMinimum: a replacement
)

// add launches n workers, each on the first host with a free slot, for
// whoever asked for them.
func (j *Job) add(ctx context.Context, n int, by startedBy) error {
	for range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		j.mu.Lock()
		if j.ended {
			j.mu.Unlock()
			return ErrEnded
		}
		if j.draining {
			j.mu.Unlock()
			return fmt.Errorf("%w: every worker was asked to leave", ErrEnded)
		}
		host, ok := j.place.pick()
		if !ok {
			j.mu.Unlock()
			return ErrNoSlot
		}
		share := max(1, j.share[host]) // as many as started there (GOMAXPROCS)
		index := j.reserveLocked(host)
		j.mu.Unlock()
		w, err := j.launch(index, host, share)
		if err != nil {
			return err
		}
		j.mu.Lock()
		j.procs[index].replacement, j.procs[index].forEngine = by == startedByFloor, by == startedByEngine
		j.mu.Unlock()
		j.emit(WorkerStarted{At: now(), Worker: w})
	}
	return nil
}

// reserveLocked takes the next launch index and counts the process as running
// on host, so that neither the job's end nor another placement overlooks it
// while it starts.
func (j *Job) reserveLocked(host string) int {
	i := len(j.procs)
	j.procs = append(j.procs, nil)
	j.running++
	j.place.running[host]++
	return i
}

// launch starts the reserved process index on host.
func (j *Job) launch(index int, host string, share int) (WorkerRef, error) {
	env := slices.Concat(j.env, []string{envconfig.EnvLaunchIndex + "=" + strconv.Itoa(index)}, j.cfg.Env)
	p, err := j.cfg.Launcher.Launch(j.workCtx, LaunchRequest{
		Index: index, Host: host, Argv: j.cfg.Argv, Env: env, Share: share,
		Output:    func(stream string, line []byte) { j.emit(WorkerOutput{Worker: index, Stream: stream, Line: line}) },
		Notice:    j.notice,
		OutputDir: j.cfg.OutputDir,
	})
	if err != nil {
		j.unreserve(host)
		return WorkerRef{}, fmt.Errorf("job: starting worker %d: %w", index, err)
	}
	ref := WorkerRef{Index: index, Host: host, PID: p.PID()}
	j.record.started(ref)
	j.mu.Lock()
	j.procs[index] = &proc{rec: WorkerRecord{WorkerRef: ref, State: Running, Started: time.Now()}, p: p}
	j.mu.Unlock()
	go j.await(index, p)
	return ref, nil
}

// unreserve gives back a reservation whose launch failed.
func (j *Job) unreserve(host string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.place.running[host]--
	j.leftLocked()
}

// leftLocked counts one process less; the job's processes have all exited
// when none is left.
func (j *Job) leftLocked() {
	if j.running--; j.running == 0 && !j.ended {
		j.ended = true
		close(j.allExited)
	}
}

// await records the end of process index.
func (j *Job) await(index int, p Process) {
	<-p.Done()
	j.mu.Lock()
	w := j.procs[index]
	w.rec.Exited, w.rec.Err = time.Now(), p.Err()
	w.p = exitedProcess(p)
	w.rec.State = classify(w.rec.Err, w.stopped)
	j.reclassifyLocked(w)
	j.anyFailed = j.anyFailed || w.rec.State == Failed
	j.countStrikeLocked(w)
	j.noteLossLocked(w)
	// A worker the engine started that ends before it ever entered a
	// world: the engine's grow stops waiting for it.
	lostStart := w.forEngine && !w.everIn && !w.removed && !w.stopped && !j.trainingOver && !j.draining
	j.place.running[w.rec.Host]--
	ev := WorkerExited{At: now(), Worker: w.rec.WorkerRef, Name: w.rec.Name, State: w.rec.State, Err: w.rec.Err}
	j.mu.Unlock()
	j.record.exited(ev)
	j.emit(ev)
	if lostStart {
		j.engine.OnStartLost()
	}
	j.blacklistOnHostError(ev.Err)
	j.mu.Lock()
	j.leftLocked()
	j.mu.Unlock()
	j.pokeFloor()
	j.pokeFirst()
}

// exitedProc is a process that has exited, kept in place of the launcher's
// Process, which holds its command, environment and pipes: the job keeps a
// record of every worker it launched, and a job under churn launches many.
type exitedProc struct {
	pid  int
	err  error
	done chan struct{} // closed
}

func exitedProcess(p Process) exitedProc {
	e := exitedProc{pid: p.PID(), err: p.Err(), done: make(chan struct{})}
	close(e.done)
	return e
}

func (e exitedProc) PID() int                   { return e.pid }
func (e exitedProc) Signal(sig os.Signal) error { return os.ErrProcessDone }
func (e exitedProc) Done() <-chan struct{}      { return e.done }
func (e exitedProc) Err() error                 { return e.err }

// waitLaunched waits for every process launched so far to exit (after
// stopWorkers), when Start fails.
func (j *Job) waitLaunched() {
	j.mu.Lock()
	var ps []Process
	for _, p := range j.procs {
		if p != nil {
			ps = append(ps, p.p)
		}
	}
	j.mu.Unlock()
	for _, p := range ps {
		<-p.Done()
	}
}

// supervise follows the job to its end (end.go has the rules).
func (j *Job) supervise() {
	finished := j.driver.Finished()
	var stopLate, stopExiting <-chan time.Time
	var finishedAt time.Time
	var prev epoch.World
	for {
		select {
		case <-finished:
			finished = nil
			finishedAt = time.Now()
			j.mu.Lock()
			j.trainingOver = true
			j.mu.Unlock()
			j.emit(TrainingFinished{At: now()})
			stopLate = time.After(j.cfg.FinishGrace)
		case <-stopLate:
			if time.Since(finishedAt) < j.cfg.RescueLimit && j.finishingLastStep() {
				stopLate = time.After(j.cfg.FinishGrace / 10)
				continue
			}
			stopLate = nil
			if j.stopLateJoiners(true) {
				stopExiting = time.After(time.Until(finishedAt.Add(j.cfg.ExitLimit)))
			}
		case <-stopExiting:
			stopExiting = nil
			j.stopLateJoiners(false)
		case <-j.poke:
			prev = j.handle(prev)
			j.pokeFloor()
		case <-j.allExited:
			if finished != nil {
				finishedAt = j.awaitLateFinish(finished)
			}
			j.handle(prev)
			j.end(finishedAt)
			return
		}
	}
}

// lateReportWait bounds how long a job whose processes have all exited
// still waits for a report that training is over (rule 1) before its
// verdict. A worker sends the report and exits: when the driver is slow (a
// loaded host, a -race build) or was frozen for a moment, it can see the
// process exit before it has read the report, which is already in its
// socket buffers, and would fail the job for "training did not finish".
const lateReportWait = 2 * time.Second

// awaitLateFinish waits, at most lateReportWait, for the driver to take a
// report of the end of training that may still be in flight once every
// process has exited; it returns when training was reported over (the
// zero time if it was not).
func (j *Job) awaitLateFinish(finished <-chan struct{}) time.Time {
	t := time.NewTimer(lateReportWait)
	defer t.Stop()
	select {
	case <-finished:
		j.mu.Lock()
		j.trainingOver = true
		j.mu.Unlock()
		j.emit(TrainingFinished{At: now()})
		return time.Now()
	case <-t.C:
		return time.Time{}
	}
}

// end closes the job once every process has exited.
func (j *Job) end(finishedAt time.Time) {
	j.stopEngine()
	<-j.engineDone
	j.stopHosts()
	j.learnNames()
	j.flushLater()
	j.mu.Lock()
	o := Outcome{JobID: j.cfg.JobID, TrainingFinished: !finishedAt.IsZero(), World: j.driver.Current(),
		LastStep: j.lastStep.Load(), Summary: j.engine.Summary()}
	for _, p := range j.procs {
		if p != nil {
			j.reclassifyLocked(p)
			o.Workers = append(o.Workers, p.rec)
		}
	}
	o.HandStarted = j.handStartedLocked(o.World)
	j.mu.Unlock()
	o.Timeline = j.mergeTimeline()
	j.outcome, j.err = o, o.Err()
	j.record.ended(o)
	j.record.close()
	j.emit(JobEnded{At: now(), Outcome: o})
	j.stopWorkers()
	_ = j.driver.Close()
	if j.jobFile != "" {
		os.Remove(j.jobFile)
	}
	close(j.done)
}

// onEpoch is the driver's hook for every proposed world, called on its
// proposing goroutine: it must not block.
func (j *Job) onEpoch(e epoch.World) {
	names := make([]string, len(e.Members))
	for i, m := range e.Members {
		names[i] = m.Name
	}
	j.firstOnce.Do(func() {
		if msg := j.startedShort(e); msg != "" {
			j.cfg.Logger.Warn(msg)
			j.later(Notice{At: now(), Message: msg})
		}
		close(j.firstWorld)
	})
	j.engine.OnWorld(heuristics.WorldChange{Epoch: e.Number, Members: names, At: time.Now()})
	j.stalls.world(e)
	j.mu.Lock()
	j.worlds = append(j.worlds, e)
	j.mu.Unlock()
	j.wake()
}

// onStats is the driver's hook for the workers' step statistics (on its
// proposing goroutine).
func (j *Job) onStats(worker string, b stats.Batch) {
	reps := stepReports(worker, b.Steps, b.TotalSteps)
	for _, s := range b.Steps {
		for last := j.lastStep.Load(); s.Step > last && !j.lastStep.CompareAndSwap(last, s.Step); last = j.lastStep.Load() {
		}
	}
	j.engine.OnReports(worker, reps)
	j.later(StepsReported{At: now(), Worker: worker, Steps: reps})
}

func (j *Job) wake() {
	select {
	case j.poke <- struct{}{}:
	default:
	}
}

// handle reports the worlds proposed since the last call and acts on hosts
// the Discovery dropped; prev is the last world reported.
func (j *Job) handle(prev epoch.World) epoch.World {
	j.mu.Lock()
	worlds, dropped := j.worlds, j.dropped
	j.worlds, j.dropped = nil, nil
	j.mu.Unlock()
	if len(worlds) > 0 {
		j.learnNames()
	}
	for _, w := range worlds {
		ev := WorldChanged{At: now(), World: w}
		for _, m := range w.Members {
			if prev.Rank(m.Name) < 0 {
				ev.Joined = append(ev.Joined, m.Name)
				if hand := j.noteHandStarted(m.Name); hand {
					ev.ByHand = append(ev.ByHand, m.Name)
				}
			}
		}
		for _, m := range prev.Members {
			if w.Rank(m.Name) < 0 {
				ev.Left = append(ev.Left, m.Name)
			}
		}
		j.emit(ev)
		j.followMembers(prev, w)
		prev = w
	}
	for _, host := range dropped {
		j.dropHost(host)
	}
	return prev
}

// learnNames maps the driver's workers to the processes of the job: by the
// launch index a worker publishes, or else by its process id on this host.
func (j *Job) learnNames() {
	ws := j.driver.Workers()
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, w := range ws {
		if p := j.matchLocked(w); p != nil {
			p.rec.Name = w.Name
			j.byName[w.Name] = p
			if w.State == membership.StateLeaving {
				if p.leaving == nil {
					p.leaving = map[string]bool{}
				}
				p.leaving[w.Name] = true
			}
		}
	}
}

func (j *Job) matchLocked(w driver.WorkerInfo) *proc {
	if w.Launch != "" {
		i, err := strconv.Atoi(w.Launch)
		if err != nil || i < 0 || i >= len(j.procs) {
			return nil
		}
		return j.procs[i]
	}
	if w.PID == 0 || w.Host != j.localHost {
		return nil
	}
	for _, p := range j.procs {
		if p != nil && p.rec.Host == "" && p.rec.PID == w.PID && p.rec.State == Running {
			return p
		}
	}
	return nil
}

// discover follows the Discovery's host lists until ctx ends.
func (j *Job) discover(ctx context.Context) {
	var once sync.Once
	err := j.cfg.Discovery.Discover(ctx, func(hosts []Host) {
		hosts = slices.Clone(hosts)
		j.mu.Lock()
		for _, h := range j.place.hosts {
			if !slices.ContainsFunc(hosts, func(n Host) bool { return n.Name == h.Name }) {
				j.dropped = append(j.dropped, h.Name)
			}
		}
		j.place.hosts = hosts
		j.mu.Unlock()
		once.Do(func() { close(j.hostsSeen) })
		j.emit(HostsChanged{At: now(), Hosts: hosts})
		j.wake()
	})
	if err != nil && ctx.Err() == nil {
		j.notice(fmt.Sprintf("host discovery failed (keeping the last host list): %v", err))
	}
}

// dropHost stops the job's workers on a host the Discovery no longer lists
// (end-of-job rule 3): the driver moves on without them at once.
func (j *Job) dropHost(host string) {
	j.mu.Lock()
	if j.place.has(host) {
		j.mu.Unlock()
		return // it came back
	}
	var victims []Process
	var names []string
	for _, p := range j.procs {
		if p != nil && p.rec.Host == host && p.rec.State == Running {
			p.stopped = true
			victims = append(victims, p.p)
			if p.rec.Name != "" {
				names = append(names, p.rec.Name)
			}
		}
	}
	j.mu.Unlock()
	if len(victims) == 0 {
		return
	}
	j.notice(fmt.Sprintf("host %q left the job: stopping its %d workers", host, len(victims)))
	for _, name := range names {
		j.driver.Remove(name)
	}
	for _, p := range victims {
		_ = p.Signal(StopSignal)
	}
}

func (j *Job) notice(msg string) { j.emit(Notice{At: now(), Message: msg}) }

// emit hands an event to every sink, one event at a time.
func (j *Job) emit(e Event) {
	if len(j.cfg.Sinks) == 0 {
		return
	}
	j.emitMu.Lock()
	defer j.emitMu.Unlock()
	for _, s := range j.cfg.Sinks {
		s.Event(e)
	}
}
