// The Job: how it starts (Start), what it tells its caller, how supervise
// follows it to its end and how it closes (end). Its worker processes are
// in workers.go, what it does about worlds, removals and host lists in
// changes.go.

package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorovod/gorovod/heuristics"
	"github.com/gorovod/gorovod/internal/envconfig"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
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
// composes: the roster of its processes (roster.go, with placement.go,
// standing.go and handstarted.go), the start (start.go), the floor under
// Config.MinWorkers (minimum.go), the end (end.go, which holds the rules),
// rejoins (rejoin.go), supervise's inbox (inbox.go), the stall watch and the
// timeline (observe.go) and the event stream to the sinks (stream.go). Job
// launches the processes (workers.go), follows the driver's worlds
// (changes.go) and ties them together.
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
	inbox  *inbox       // what supervise has yet to act on

	hostsSeen chan struct{} // closed at the first host list
	lastStep  atomic.Int64

	stalls   *stallWatch  // the driver's half of the stall inspector
	timeline *jobTimeline // Config.Timeline's; nil without it
	record   *jobRecord   // Config.OutputDir's record.tsv; nil without it

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
	// Where this runner's driver listens when it cannot bind the dead
	// driver's address (adopting).
	ownGossip := cfg.Gossip
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
	r := newRoster(localHost, cfg.KeepExitedWorkers)
	j := &Job{cfg: cfg, roster: r, start: newFirstWorld(cfg, r),
		hostsSeen: make(chan struct{}), inbox: newInbox(),
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
		if j.timeline, err = openJobTimeline(cfg.Timeline, cfg.JobID); err != nil {
			j.record.close()
			return nil, err
		}
		j.events.sinks = append(slices.Clone(cfg.Sinks), j.timeline.sink())
	}
	go j.events.run()
	r.onGossip = j.record.gossip // nil-safe: no record without OutputDir

	startCtx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	dcfg := driver.Config{
		JobID: cfg.JobID, Secret: cfg.Secret, MinWorkers: cfg.Workers, FirstWorld: cfg.Workers, Membership: cfg.Gossip, // start.go
		Logger: cfg.Logger, OnEpoch: j.onEpoch, OnStats: j.onStats, OnStall: j.onStall, OnRemoved: j.onRemoved,
		ProbeTimeout: cfg.ProbeTimeout,
	}
	if cfg.Adopt != nil {
		// The job has started long ago: its floor is the minimum.
		dcfg.MinWorkers, dcfg.Adopt, dcfg.Contact = cfg.MinWorkers, true, cfg.Adopt.Contact
		j.start.once.Do(func() { close(j.start.formed) })
	}
	if cfg.Adopt != nil && cfg.Adopt.OwnAddr {
		err = notOwnSeed(ownGossip.BindAddr, cfg.Gossip.BindAddr)
	}
	if err == nil {
		j.driver, err = cfg.StartDriver(startCtx, dcfg)
	}
	if err != nil && cfg.Adopt != nil {
		// The dead driver's address is not to be had (another process has
		// its port; a new pod has another IP), or not this runner's: listen
		// where this runner would for a job of its own, and contact the
		// workers.
		seedErr := err
		dcfg.Membership = ownGossip
		if ownGossip.BindAddr == cfg.Gossip.BindAddr && ownGossip.BindPort == cfg.Gossip.BindPort {
			// Its own address is the seed (a pod at the dead driver's IP
			// with the same fixed port), whose port another process has:
			// another port of it.
			dcfg.Membership.BindPort = 0
		}
		if j.driver, err = cfg.StartDriver(startCtx, dcfg); err != nil {
			err = fmt.Errorf("%w (at the workers' seed %s:%d: %w)", err, cfg.Gossip.BindAddr, cfg.Gossip.BindPort, seedErr)
		} else {
			j.events.notice(fmt.Sprintf("the workers' seed %s:%d cannot be bound (%v): this driver listens at %s and contacts the workers at %s",
				cfg.Gossip.BindAddr, cfg.Gossip.BindPort, seedErr, j.driver.GossipAddr(), strings.Join(cfg.Adopt.Contact, ", ")))
		}
	}
	if err != nil {
		j.events.flush()
		j.timeline.merge(j.events.notice)
		j.record.close()
		return nil, err
	}
	fail := func(err error) (*Job, error) {
		j.stopWorkers()
		j.waitLaunched()
		j.stopHosts()
		_ = j.driver.Close()
		j.events.release()
		j.events.flush()
		j.timeline.merge(j.events.notice)
		j.record.close()
		if j.jobFile != "" {
			os.Remove(j.jobFile)
		}
		return nil, err
	}
	// Until the job is announced (JobStarted), what its workers and hosts
	// report waits: it comes after.
	j.events.hold()
	j.workCtx, j.stopWorkers = context.WithCancel(ctx)
	j.ending = &ending{cfg: cfg, driver: j.driver, roster: r, events: j.events, stopAll: j.stopWorkers}
	j.floor = &floor{min: cfg.MinWorkers, replaceLost: cfg.ReplaceLost, roster: r, driver: j.driver, events: j.events,
		grow: j.addReplacement, giveUp: func() { j.ending.stopLateJoiners(StopStranded, false) }, poke: make(chan struct{}, 1)}
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
	// driver for a blamed worker's answer. The elastic timeout bounds each
	// worker's wait for a world.
	if cfg.Adopt != nil {
		// The job's seed is this driver from now on: for the workers it
		// starts, those started by hand with the job file, and a runner
		// that takes the job back after this one.
		j.env = withSeeds(cfg.Adopt.Env, j.driver.GossipAddr())
		if !slices.Equal(j.env, cfg.Adopt.Env) {
			if err := writeEnvFile(cfg.OutputDir, j.env); err != nil {
				return fail(err)
			}
		}
	} else {
		j.env = envconfig.ElasticWorker{JobID: cfg.JobID, Secret: cfg.Secret, Seeds: []string{j.driver.GossipAddr()},
			MinWorkers: cfg.MinWorkers, FirstWorld: cfg.Workers, ProbeTimeout: cfg.ProbeTimeout, ElasticTimeout: cfg.ElasticTimeout}.Environ()
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
	r.place.share = share
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
	first := []Event{JobStarted{At: now(), JobID: cfg.JobID, DriverAddr: j.driver.GossipAddr(), JobFile: j.jobFile, Workers: cfg.Workers}}
	for _, w := range started {
		first = append(first, WorkerStarted{At: now(), Worker: w, Initial: true})
	}
	j.events.release(first...)
	engineCtx := j.run(ctx)
	go j.start.run(engineCtx, launched, startHooks{ // start.go
		setMin: j.driver.SetMinWorkers, setFirst: j.driver.SetFirstWorld, joined: j.driver.Workers,
		warn: func(msg string) {
			j.cfg.Logger.Warn(msg)
			j.events.notice(msg)
		},
		giveUp: func(e *StartError) {
			msg := fmt.Sprintf("the job gives up: %v; stopping its workers", e)
			j.cfg.Logger.Error(msg)
			j.events.notice(msg)
			j.ending.stopLateJoiners(StopStranded, false)
		},
	})
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
	go j.floor.run(engineCtx)         // minimum.go
	go j.watchUnresponsive(engineCtx) // unresponsive.go
	return engineCtx
}

// ID is the job's id.
func (j *Job) ID() string { return j.cfg.JobID }

// DriverAddr is the gossip address workers join the job through.
func (j *Job) DriverAddr() string { return j.driver.GossipAddr() }

// Superseded is closed when a newer driver of the job came into this
// job's driver's view (it took the job back while this one was cut off or
// frozen): this driver has stopped proposing and left the workers to it.
// Never closed for a driver that cannot tell (Config.StartDriver's).
func (j *Job) Superseded() <-chan struct{} {
	if d, ok := j.driver.(interface{ Superseded() <-chan struct{} }); ok {
		return d.Superseded()
	}
	return nil
}

// WorkerGossipAddrs lists the gossip addresses of the workers in the
// driver's view, sorted: where a driver that takes the job back contacts
// them (on Kubernetes, the job's status.adoption keeps them).
func (j *Job) WorkerGossipAddrs() []string {
	var addrs []string
	for _, w := range j.driver.Workers() {
		if w.Gossip != "" {
			addrs = append(addrs, w.Gossip)
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

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

// Workers describes the worker processes the runner launched that still run
// and the newest Config.KeepExitedWorkers that exited, by launch
// index.
func (j *Job) Workers() []WorkerRecord { return j.roster.records() }

// Done is closed when the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits for the job to end and returns its outcome, and the outcome's
// error (Outcome.Err) when the job failed.
func (j *Job) Wait() (Outcome, error) {
	<-j.done
	return j.outcome, j.err
}

// supervise follows the job to its end (end.go has the rules, ending its
// clock): the report that training is over, the inbox's news, and
// the exit of every process.
func (j *Job) supervise() {
	finished := j.driver.Finished()
	var prev epoch.World
	for {
		select {
		case <-finished:
			finished = nil
			j.ending.reported()
		case <-j.ending.late:
			j.ending.lookLate()
		case <-j.ending.exiting:
			j.ending.exitLimit()
		case <-j.inbox.poke:
			prev = j.handle(prev)
			j.floor.wake()
		case <-j.roster.standing.allExited:
			if finished != nil {
				j.ending.awaitLateReport(finished)
			}
			j.handle(prev)
			j.end(j.ending.finishedAt)
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
		LastStep: j.lastStep.Load(), Summary: j.engine.Summary(), NoWorld: j.start.failed.Load()}
	o.Workers, o.EarlierWorkers, o.HandStarted = j.roster.final(o.World)
	o.Timeline = j.timeline.merge(j.events.notice)
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
