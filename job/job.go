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
	"syscall"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/job/launch"
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
// autoscaling engine. Its concerns are types of their own, which it
// composes: the roster of its processes (roster.go), the start (start.go),
// the floor under Config.MinWorkers (minimum.go), the end (end.go, which
// holds the rules) and the event stream to the sinks (stream.go); Job
// launches the processes, follows the driver's worlds and ties them
// together.
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

	roster *roster      // its processes and where the job stands
	start  *firstWorld  // the first world waits for Config.Workers
	floor  *floor       // keeps it at Config.MinWorkers
	ending *ending      // the end of training (end.go's rules 1–3)
	events *eventStream // its events, to Config.Sinks

	hostsSeen chan struct{} // closed at the first host list
	poke      chan struct{} // supervise looks at the roster's news
	lastStep  atomic.Int64

	stalls   *stallWatch        // the driver's half of the stall inspector
	timeline *timeline.Timeline // the driver's part of Config.Timeline
	record   *jobRecord         // Config.OutputDir's record.tsv; nil without it

	done    chan struct{}
	outcome Outcome
	err     error
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
	var err error
	if cfg.Adopt != nil {
		if cfg, err = cfg.adopting(); err != nil {
			return nil, err
		}
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	localHost, _ := os.Hostname()
	r := newRoster(localHost)
	j := &Job{cfg: cfg, roster: r, start: newFirstWorld(cfg, r),
		hostsSeen: make(chan struct{}), poke: make(chan struct{}, 1),
		engineDone: make(chan struct{}), done: make(chan struct{}),
		events: newEventStream(cfg.Sinks), stalls: newStallWatch(cfg.StallCheck)}
	ecfg := cfg.Autoscaling
	ecfg.OnEvent = func(ev heuristics.Event) { j.events.emit(Autoscaling{ev}) }
	if j.engine, err = heuristics.NewEngine(ecfg, cluster{j}, provisioner{j}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.OutputDir != "" {
		if j.record, err = openJobRecord(cfg.OutputDir, cfg.JobID, cfg.Adopt != nil); err != nil {
			return nil, err
		}
	}
	if cfg.Timeline != "" {
		if j.timeline, err = openDriverTimeline(cfg.Timeline, cfg.JobID); err != nil {
			j.record.close()
			return nil, err
		}
		j.events.sinks = append(slices.Clone(cfg.Sinks), driverTimeline{j.timeline})
	}
	go j.events.run()

	startCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	dcfg := driver.Config{
		JobID: cfg.JobID, Secret: cfg.Secret, MinWorkers: cfg.Workers, FirstWorld: cfg.Workers, Membership: cfg.Gossip, // start.go
		Logger: cfg.Logger, OnEpoch: j.onEpoch, OnStats: j.onStats, OnStall: j.onStall, OnRemoved: j.onRemoved,
		ProbeTimeout: cfg.ProbeTimeout,
	}
	if cfg.Adopt != nil {
		// The job has started long ago: its floor is the minimum.
		dcfg.MinWorkers, dcfg.Adopt = cfg.MinWorkers, true
		j.start.once.Do(func() { close(j.start.formed) })
	}
	j.driver, err = cfg.StartDriver(startCtx, dcfg)
	if err != nil {
		j.events.flush()
		j.mergeTimeline()
		j.record.close()
		return nil, err
	}
	fail := func(err error) (*Job, error) {
		j.stopWorkers()
		j.waitLaunched()
		j.stopHosts()
		_ = j.driver.Close()
		j.events.flush()
		j.mergeTimeline()
		j.record.close()
		if j.jobFile != "" {
			os.Remove(j.jobFile)
		}
		return nil, err
	}
	j.workCtx, j.stopWorkers = context.WithCancel(ctx)
	j.ending = &ending{cfg: cfg, driver: j.driver, roster: r, events: j.events, stopAll: j.stopWorkers}
	j.floor = &floor{min: cfg.MinWorkers, replaceLost: cfg.ReplaceLost, roster: r, driver: j.driver, events: j.events,
		grow: j.addReplacement, poke: make(chan struct{}, 1)}
	var hostsCtx context.Context
	hostsCtx, j.stopHosts = context.WithCancel(context.Background())
	go j.discover(hostsCtx)
	select {
	case <-j.hostsSeen:
	case <-startCtx.Done():
		return fail(fmt.Errorf("job: no host list from the discovery: %w", startCtx.Err()))
	}

	// The job's minimum and its size go to every worker: one that takes
	// over proposing (the driver out of its view for a while) must not form
	// a smaller world, nor a first world without a majority of the first
	// workers (the others may be forming one with the driver). So does the
	// driver's probe timeout: one that takes over waits as long as the
	// driver for a blamed worker's answer.
	if cfg.Adopt != nil {
		j.env = slices.Clone(cfg.Adopt.Env)
	} else {
		j.env = envconfig.ElasticWorker{JobID: cfg.JobID, Secret: cfg.Secret, Seeds: []string{j.driver.GossipAddr()},
			MinWorkers: cfg.MinWorkers, FirstWorld: cfg.Workers, ProbeTimeout: cfg.ProbeTimeout}.Environ()
		j.env = append(j.env, cfg.observabilityEnv()...)
		if cfg.OutputDir != "" {
			// For a runner that adopts the job if this one dies.
			if err := writeEnvFile(cfg.OutputDir, j.env); err != nil {
				return fail(err)
			}
		}
	}
	if cfg.JobFile {
		sweepJobFiles(os.TempDir(), cfg.Logger)
		if j.jobFile, err = writeJobFile(os.TempDir(), j.env); err != nil {
			return fail(err)
		}
	}

	if cfg.Adopt != nil {
		return j.adopted(ctx, fail)
	}

	// Place the first workers, then launch them: the hosts in parallel, each
	// host's workers one after another in launch order (so that a host's
	// devices go to its workers in ring order).
	r.mu.Lock()
	type slot struct {
		index int
		host  string
	}
	slots := make([]slot, cfg.Workers)
	share := map[string]int{}
	for i := range slots {
		h, ok := r.place.pick()
		if !ok {
			r.mu.Unlock()
			return fail(fmt.Errorf("%w: %d workers, but the hosts have slots for %d", ErrNoSlot, cfg.Workers, i))
		}
		slots[i] = slot{r.reserveLocked(h), h}
		share[h]++
	}
	r.share = share
	r.mu.Unlock()
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
	j.events.emit(JobStarted{At: now(), JobID: cfg.JobID, DriverAddr: j.driver.GossipAddr(), JobFile: j.jobFile, Workers: cfg.Workers})
	for _, w := range started {
		j.events.emit(WorkerStarted{At: now(), Worker: w, Initial: true})
	}
	engineCtx := j.run(ctx)
	go j.start.run(engineCtx, launched, j.driver.SetMinWorkers, j.driver.SetFirstWorld) // start.go
	return j, nil
}

// run starts the engine, the supervision and the floor of a job whose
// processes are in the roster, and returns the engine's context.
func (j *Job) run(ctx context.Context) context.Context {
	var engineCtx context.Context
	engineCtx, j.stopEngine = context.WithCancel(ctx)
	go func() {
		defer close(j.engineDone)
		_ = j.engine.Run(engineCtx)
	}()
	go j.supervise()
	go j.floor.run(engineCtx) // minimum.go
	return engineCtx
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
func (j *Job) Workers() []WorkerRecord { return j.roster.records() }

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
	for _, p := range j.roster.drain() {
		_ = p.Signal(LeaveSignal)
	}
}

// count is how many workers the job has: its processes still running (or
// starting) and the hand-started workers in the driver's view.
func (j *Job) count() int { return j.roster.count(j.driver.Workers()) }

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
		index, host, share, err := j.roster.reserve()
		if err != nil {
			return err
		}
		w, err := j.launch(index, host, share)
		if err != nil {
			return err
		}
		j.roster.markStartedBy(index, by)
		j.events.emit(WorkerStarted{At: now(), Worker: w})
	}
	return nil
}

// addReplacement launches one worker for the floor, within
// Config.MaxWorkers.
func (j *Job) addReplacement(ctx context.Context) error {
	if err := j.roomFor(1); err != nil {
		return err
	}
	return j.add(ctx, 1, startedByFloor)
}

// launch starts the reserved process index on host.
func (j *Job) launch(index int, host string, share int) (WorkerRef, error) {
	env := slices.Concat(j.env, []string{envconfig.EnvLaunchIndex + "=" + strconv.Itoa(index)}, j.cfg.Env)
	p, err := j.cfg.Launcher.Launch(j.workCtx, LaunchRequest{
		Index: index, Host: host, Argv: j.cfg.Argv, Env: env, Share: share,
		Output: func(stream string, line []byte) {
			j.events.emit(WorkerOutput{Worker: index, Stream: stream, Line: line})
		},
		Notice:    j.events.notice,
		OutputDir: j.cfg.OutputDir,
	})
	if err != nil {
		j.roster.unreserve(host)
		return WorkerRef{}, fmt.Errorf("job: starting worker %d: %w", index, err)
	}
	ref := WorkerRef{Index: index, Host: host, PID: p.PID()}
	j.record.started(ref)
	if s, ok := p.(interface{ Started() <-chan struct{} }); ok && ref.PID == 0 {
		// A remote worker's pid on its host is known once it runs there:
		// an adopting runner needs it (Config.Adopt).
		go func() {
			select {
			case <-s.Started():
				j.record.running(index, p.PID())
			case <-p.Done():
			}
		}()
	}
	j.roster.launched(index, ref, p)
	go j.await(index, p)
	return ref, nil
}

// await records the end of process index.
func (j *Job) await(index int, p Process) {
	<-p.Done()
	reported := false
	if errors.Is(p.Err(), ErrExitUnknown) { // an adopted worker
		reported = j.reportedEnd(index)
	}
	ev, lostStart := j.roster.exited(index, p, reported, j.floor.noteExitLocked)
	var lostHost *launch.HostError
	if !errors.As(ev.Err, &lostHost) {
		// The process is known to have ended (a broken connection to its
		// host is not proof: the host may be cut off, the worker training),
		// under every name it had.
		j.learnNames()
		for _, name := range j.roster.names(index) {
			j.driver.Exited(name)
		}
	}
	j.record.exited(ev)
	j.events.emit(ev)
	if lostStart {
		// A worker the engine started ended before it ever entered a
		// world: the engine's grow stops waiting for it.
		j.engine.OnStartLost()
	}
	j.blacklistOnHostError(ev.Err)
	j.roster.left()
	j.floor.wake()
	j.start.wake()
}

// waitLaunched waits for every process launched so far to exit (after
// stopWorkers), when Start fails.
func (j *Job) waitLaunched() {
	for _, p := range j.roster.processes() {
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
			j.ending.trainingFinished()
			stopLate = time.After(j.cfg.FinishGrace)
		case <-stopLate:
			if time.Since(finishedAt) < j.cfg.RescueLimit && j.ending.finishingLastStep() {
				stopLate = time.After(j.cfg.FinishGrace / 10)
				continue
			}
			stopLate = nil
			if j.ending.stopLateJoiners(true) {
				stopExiting = time.After(time.Until(finishedAt.Add(j.cfg.ExitLimit)))
			}
		case <-stopExiting:
			stopExiting = nil
			j.ending.stopLateJoiners(false)
		case <-j.poke:
			prev = j.handle(prev)
			j.floor.wake()
		case <-j.roster.allExited:
			if finished != nil {
				finishedAt = j.ending.awaitLateReport(finished)
			}
			j.handle(prev)
			j.end(finishedAt)
			return
		}
	}
}

// end closes the job once every process has exited.
func (j *Job) end(finishedAt time.Time) {
	j.stopEngine()
	<-j.engineDone
	j.stopHosts()
	j.learnNames()
	j.events.flush()
	o := Outcome{JobID: j.cfg.JobID, TrainingFinished: !finishedAt.IsZero(), World: j.driver.Current(),
		LastStep: j.lastStep.Load(), Summary: j.engine.Summary()}
	o.Workers, o.HandStarted = j.roster.final(o.World)
	o.Timeline = j.mergeTimeline()
	j.outcome, j.err = o, o.Err()
	j.record.ended(o)
	j.record.close()
	j.events.emit(JobEnded{At: now(), Outcome: o})
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
	j.start.formedWith(e, func(msg string) {
		j.cfg.Logger.Warn(msg)
		j.events.later(Notice{At: now(), Message: msg})
	})
	j.engine.OnWorld(heuristics.WorldChange{Epoch: e.Number, Members: names, At: time.Now()})
	j.stalls.world(e)
	j.roster.addWorld(e)
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
	j.events.later(StepsReported{At: now(), Worker: worker, Steps: reps})
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
	worlds, dropped, stuck := j.roster.news()
	if len(worlds) > 0 {
		j.learnNames()
	}
	for _, w := range worlds {
		ev := WorldChanged{At: now(), World: w}
		for _, m := range w.Members {
			if prev.Rank(m.Name) < 0 {
				ev.Joined = append(ev.Joined, m.Name)
				if hand := j.roster.noteHandStarted(m.Name); hand {
					ev.ByHand = append(ev.ByHand, m.Name)
				}
			}
		}
		for _, m := range prev.Members {
			if w.Rank(m.Name) < 0 {
				ev.Left = append(ev.Left, m.Name)
			}
		}
		j.events.emit(ev)
		j.roster.followMembers(prev, w)
		prev = w
	}
	for _, host := range dropped {
		j.dropHost(host)
	}
	if len(stuck) > 0 {
		j.learnNames()
	}
	for _, name := range stuck {
		j.stopStuck(name)
	}
	return prev
}

// learnNames maps the driver's workers to the processes of the job.
func (j *Job) learnNames() { j.roster.learn(j.driver.Workers()) }

// discover follows the Discovery's host lists until ctx ends.
func (j *Job) discover(ctx context.Context) {
	var once sync.Once
	err := j.cfg.Discovery.Discover(ctx, func(hosts []Host) {
		hosts = slices.Clone(hosts)
		j.roster.setHosts(hosts)
		once.Do(func() { close(j.hostsSeen) })
		j.events.emit(HostsChanged{At: now(), Hosts: hosts})
		j.wake()
	})
	if err != nil && ctx.Err() == nil {
		j.events.notice(fmt.Sprintf("host discovery failed (keeping the last host list): %v", err))
	}
}

// onRemoved is the driver's hook for the workers its proposer takes out of
// the job (on its proposing goroutine): supervise stops those removed as
// stuck (stopStuck).
func (j *Job) onRemoved(name string, why epoch.Reason) {
	if why == epoch.ReasonFinished {
		j.roster.addDoneEarly(name)
		return
	}
	if why != epoch.ReasonStuck {
		return
	}
	j.roster.addStuck(name)
	j.wake()
}

// stopStuck stops the process behind a member the driver removed as stuck
// (end-of-job rule 3): blamed for the failures of several worlds in a row
// while it answered every probe, it is never admitted again under its name,
// and its process, alive, would count as a worker staying in the job: the
// floor would start no replacement, and a job at its minimum would wait
// for a world forever. Stopped, it is replaced like a lost worker (a host
// that keeps a stuck worker is treated as Horovod treats a failing one: the
// job goes on with other processes). StopSignal first; SIGKILL after
// Config.RemoveGrace if it ignored that (a deadlocked process may).
func (j *Job) stopStuck(name string) {
	ref, proc, ok := j.roster.stopStuck(name)
	if !ok {
		j.events.notice(fmt.Sprintf("worker %s was removed from the job as stuck (blamed for the failures of several worlds in a row while it answered its probes); it is not a running process of this job, so it is left to whoever started it", name))
		return
	}
	j.events.notice(fmt.Sprintf("worker %d (%s, pid %d) was removed from the job as stuck (blamed for the failures of several worlds in a row while it answered its probes): stopping it, and the job's minimum starts another in its place", ref.Index, name, ref.PID))
	go func() {
		// Bounded by the ladder (twice RemoveGrace); the launcher stops
		// the process anyway when the job ends.
		err := j.signalUntilExit(context.Background(), ref, name, ", removed as stuck,", proc,
			[]stopStep{{StopSignal, j.cfg.RemoveGrace}, {syscall.SIGKILL, j.cfg.RemoveGrace}})
		if err != nil {
			j.events.notice(fmt.Sprintf("worker %d (%s): %v", ref.Index, name, err))
		}
	}()
}

// dropHost stops the job's workers on a host the Discovery no longer lists
// (end-of-job rule 3): the driver moves on without them at once.
func (j *Job) dropHost(host string) {
	victims, names := j.roster.stopHost(host)
	if len(victims) == 0 {
		return
	}
	j.events.notice(fmt.Sprintf("host %q left the job: stopping its %d workers", host, len(victims)))
	for _, name := range names {
		j.driver.Remove(name)
	}
	for _, p := range victims {
		_ = p.Signal(StopSignal)
	}
}
