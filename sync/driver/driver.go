package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// Config configures the job's driver: the process (`gorovod run`) that
// proposes world epochs.
type Config struct {
	JobID      string
	Secret     []byte
	MinWorkers int
	// FirstWorld is the number of workers the job was started with (0: not
	// known): the job's first world is proposed only with at least half of
	// them (epoch.CheckFirstQuorum; the driver wins the tie). SetFirstWorld
	// lowers it as first workers exit before they joined.
	FirstWorld int
	// Coalesce: changes closer together than this make one epoch (default
	// 10 ms).
	Coalesce time.Duration
	// ProbeTimeout bounds the wait for the answer of a worker the driver
	// probes after a failure report (the blamed worker, and every member of
	// the failed world once) before it leaves the next world as unanswered
	// (epoch.ReasonUnanswered), and after gossip declared a member dead
	// (before it leaves as failed, epoch.ReasonFailed); default 500 ms
	// (epoch.ProposerConfig). A
	// worker that cannot answer within it (its process starved of CPU that
	// long, a slow network) is left out although alive, until it is heard
	// from again; a longer timeout holds the next world that long when a
	// worker is frozen. A worker whose process is gone is removed at once
	// whatever it is: the probe's connection is refused.
	ProbeTimeout time.Duration
	// Membership: gossip settings (bind address, timings); JobID and Secret
	// above override its fields.
	Membership membership.Config
	// OnEpoch and OnStats let an autoscaling engine watch the job: every
	// proposed epoch, in order, and every worker's step statistics. They are
	// called on the driver's proposing goroutine and must not block.
	OnEpoch func(epoch.World)
	OnStats func(worker string, b stats.Batch)
	// OnStall receives the workers' stall inspector snapshots (sent at every
	// stall warning and as a slow heartbeat), on the same goroutine.
	OnStall func(worker string, s stall.Snapshot)
	// OnRemoved is told of every worker the driver's proposer takes out of
	// the desired membership, with why (epoch.Removed), on the same
	// goroutine. A launcher needs epoch.ReasonStuck above all: a worker
	// removed as stuck answers its probes, so its process keeps running,
	// and is never admitted again under its name; its launcher must stop it
	// and start another in its place, or the job may wait below its
	// MinWorkers forever with the stuck process counted as a live worker.
	OnRemoved func(name string, why epoch.Reason)
	Logger    *slog.Logger
	// Adopt makes this driver take a running job back (its driver died; a
	// worker proposes in its place): it learns the job's newest epoch from
	// the workers as they come into its view and proposes nothing until
	// every member of that epoch has answered, or AdoptWait has passed
	// (epoch.Adopt). The workers come back by themselves when it binds the
	// dead driver's gossip address (their seed, which they contact again
	// every second while no driver is in view); at another address, the
	// driver contacts them itself (Contact).
	Adopt bool
	// Contact are the gossip addresses of a running job's workers, for a
	// driver that takes the job back (Adopt): it contacts them
	// (membership.Member.Contact) every ContactEvery until a worker is in
	// its view or it is closed, so the workers, whose seed may be gone with
	// the dead driver's address, learn of it wherever it runs. One worker
	// that answers is enough: gossip tells the others.
	Contact []string
	// AdoptWait bounds how long an adopting driver waits for the workers'
	// epochs (default 10 s).
	AdoptWait time.Duration
}

// ContactEvery is how often an adopting driver contacts the workers'
// addresses (Config.Contact) while none is in its view: as often as the
// workers go back to their seeds.
const ContactEvery = time.Second

// DefaultAdoptWait is Config.AdoptWait's default: the workers come back
// within a second or two (they contact their seed every second).
const DefaultAdoptWait = 10 * time.Second

// Driver is the single epoch proposer of an elastic job: a thin loop around
// an epoch.Proposer. It feeds it the membership (workers that become ready,
// leave or fail) and the workers' control messages (failure reports, the end
// of training, answers to liveness probes), and carries out what it decides:
// it sends every epoch to every worker it knows, probes blamed workers, and
// tells the launcher when training is over.
type Driver struct {
	cfg  Config
	log  *slog.Logger
	m    *membership.Member
	prop *epoch.Proposer // touched only on the loop's goroutine
	loop *loop

	// What other goroutines read, updated by the loop after each change.
	current    epoch.Newest
	mu         stdsync.Mutex
	unfinished []string
	workers    []WorkerInfo

	finished     chan struct{}
	finishedOnce stdsync.Once
	// superseded is closed when a newer driver of the job came into view
	// (watchDrivers): this one stopped proposing and left.
	superseded     chan struct{}
	supersededOnce stdsync.Once
	background     stdsync.WaitGroup // contactWorkers, and the leave of a superseded driver
}

// Start joins the gossip cluster as its first member (the workers use
// GossipAddr as their seed) and starts proposing.
func Start(ctx context.Context, cfg Config) (*Driver, error) {
	if cfg.JobID == "" || len(cfg.Secret) == 0 {
		return nil, errors.New("driver: Config needs JobID and Secret")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mc := cfg.Membership
	mc.Secret, mc.Logger = cfg.Secret, log
	m, err := membership.Join(ctx, mc, membership.Meta{JobID: cfg.JobID, Role: membership.RoleDriver, State: membership.StateReady})
	if err != nil {
		return nil, err
	}
	pc := epoch.ProposerConfig{Coalesce: cfg.Coalesce, MinWorkers: cfg.MinWorkers, FirstWorld: cfg.FirstWorld, ProbeTimeout: cfg.ProbeTimeout}
	prop := epoch.NewProposer(pc)
	if cfg.Adopt {
		if cfg.AdoptWait <= 0 {
			cfg.AdoptWait = DefaultAdoptWait
		}
		prop = epoch.Adopt(pc, time.Now(), cfg.AdoptWait)
	}
	d := &Driver{cfg: cfg, log: log, m: m, finished: make(chan struct{}), superseded: make(chan struct{}), prop: prop}
	d.loop = newLoop(m, d.prop, log)
	d.loop.notify = d.notify
	d.loop.settled = d.publish
	d.loop.onEvent = d.watchDrivers
	if cfg.OnStats != nil {
		d.loop.onStats = cfg.OnStats
	}
	if cfg.OnStall != nil {
		d.loop.onStall = cfg.OnStall
	}
	d.loop.start()
	if cfg.Adopt && len(cfg.Contact) > 0 {
		d.background.Go(func() { d.contactWorkers(d.loop.ctx, cfg.Contact) })
	}
	return d, nil
}

// contactWorkers contacts the workers at addrs every ContactEvery until one
// is in the driver's view, or ctx ends.
func (d *Driver) contactWorkers(ctx context.Context, addrs []string) {
	tick := time.NewTicker(ContactEvery)
	defer tick.Stop()
	for {
		if slices.ContainsFunc(d.m.Members(), func(n membership.Node) bool { return n.Meta.Role == membership.RoleWorker }) {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, ContactEvery)
		if err := d.m.Contact(cctx, addrs); err != nil {
			d.log.Debug("the job's workers do not answer at their gossip addresses yet", "addrs", addrs, "err", err)
		} else {
			d.log.Info("contacted the job's workers at their gossip addresses", "addrs", addrs)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watchDrivers is the loop's hook for membership events: a driver of the
// job newer than this one (epoch.Supersedes: one that took the job back
// while this one was cut off, frozen or thought dead) makes this one stop
// proposing at once and leave, so the job never has two proposers: the
// workers follow the newest driver in their view too (epoch.Elect).
func (d *Driver) watchDrivers(ev membership.Event) {
	n := ev.Node
	if (ev.Kind != membership.EventJoined && ev.Kind != membership.EventUpdated) ||
		n.Meta.Role != membership.RoleDriver || n.Name == d.m.Name() ||
		!epoch.Supersedes(peerOf(n), peerOf(d.m.Local())) {
		return
	}
	d.supersededOnce.Do(func() {
		d.log.Warn("a newer driver of the job is in view: this one stops proposing and leaves the job to it",
			"driver", n.Name, "addr", n.Addr.String())
		d.loop.cancel() // on the loop's goroutine: it proposes nothing more (loop.event)
		close(d.superseded)
		d.background.Go(func() { _ = d.m.Leave(context.Background()) }) // bounded by Membership.LeaveTimeout
	})
}

// Superseded is closed once a newer driver of the job came into this one's
// view: this one has stopped proposing and left the gossip cluster, and
// its runner should leave the workers to the newer one.
func (d *Driver) Superseded() <-chan struct{} { return d.superseded }

func (d *Driver) notify(o epoch.Output) {
	switch o := o.(type) {
	case epoch.Proposed:
		if d.cfg.OnEpoch != nil {
			d.cfg.OnEpoch(o.World)
		}
	case epoch.TookOver:
		// An adopting driver continues from the workers' world: for the
		// launcher it is the first world it sees (another may follow at
		// once, if members are gone).
		if o.Adopted && d.cfg.OnEpoch != nil && o.World.Number > 0 {
			d.cfg.OnEpoch(o.World)
		}
	case epoch.Removed:
		if d.cfg.OnRemoved != nil {
			d.cfg.OnRemoved(o.Name, o.Why)
		}
	case epoch.Finished:
		d.finishedOnce.Do(func() { close(d.finished) })
	}
}

// publish makes the proposer's state readable from other goroutines.
func (d *Driver) publish() {
	d.current.Put(d.prop.Current())
	unfinished := d.prop.Unfinished()
	var workers []WorkerInfo
	if d.loop.viewChanged {
		d.loop.viewChanged = false
		workers = workerInfos(d.loop.nodes)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unfinished = unfinished
	if workers != nil {
		d.workers = workers
	}
}

// GossipAddr is the driver's membership address: the seed workers join through.
func (d *Driver) GossipAddr() string { return d.m.Local().Addr.String() }

// Current is the newest proposed epoch.
func (d *Driver) Current() epoch.World { return d.current.World() }

// Finished is closed once a worker of the current world reports that training
// is over (Worker.Finish): workers still waiting to join have nothing left to
// do, and the launcher stops them.
func (d *Driver) Finished() <-chan struct{} { return d.finished }

// Unfinished lists the members of the current world that have not reported
// that training is over: after Finished, these are workers still finishing
// the last step (in a world of their own if a collective of it failed for
// them alone), which a launcher should let finish. Members admitted into a
// world the finished ones never entered are not listed: they have no last
// step to finish (epoch.ReasonLate).
func (d *Driver) Unfinished() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.unfinished)
}

// Await waits for an epoch numbered above after (for launchers and tests).
func (d *Driver) Await(ctx context.Context, after uint64) (epoch.World, error) {
	return d.current.Await(ctx, after)
}

// Remove takes a worker out of the job for good (a scale-down): the next epoch
// leaves it out, its Commit returns ErrExcluded at that step boundary, and it
// is not admitted again. It returns at once; the decision is taken on the
// driver's goroutine.
func (d *Driver) Remove(name string) {
	d.loop.do(func(now time.Time) []epoch.Output { return d.prop.Step(now, epoch.Evict{Name: name}) })
}

// RemoveLost takes a worker out of the job for good because its launcher
// lost it (its process, or the ssh connection to its host, is gone), as
// Remove does; the failure of the current world that its loss causes is
// explained by it, and the next world is proposed without first probing
// every member (epoch.Evict's Lost).
func (d *Driver) RemoveLost(name string) {
	d.loop.do(func(now time.Time) []epoch.Output { return d.prop.Step(now, epoch.Evict{Name: name, Lost: true}) })
}

// Exited tells the driver that worker name's process has ended (its
// launcher saw it exit): unlike a worker gossip declares dead, which may be
// alive behind a partition, it no longer counts towards the quorum of the
// next world (epoch.CheckQuorum), so survivors go on without it however few
// they are. It returns at once; the change is made on the driver's
// goroutine.
func (d *Driver) Exited(name string) {
	d.loop.do(func(now time.Time) []epoch.Output { return d.prop.Step(now, epoch.Exited{Name: name}) })
}

// SetMinWorkers changes the fewest workers a world may have from now on
// (Config.MinWorkers): a job that waits for all its first workers before
// its first world lowers it to its floor once that world has formed. It
// returns at once; the change is made on the driver's goroutine.
func (d *Driver) SetMinWorkers(n int) {
	d.loop.do(func(now time.Time) []epoch.Output { return d.prop.Step(now, epoch.SetMinWorkers{N: n}) })
}

// SetFirstWorld changes the voters of the job's first world
// (Config.FirstWorld): the job's first workers less those whose processes
// exited before any world formed (their deaths are known; the others may be
// alive behind a partition). It changes nothing once a world has formed. It
// returns at once; the change is made on the driver's goroutine.
func (d *Driver) SetFirstWorld(n int) {
	d.loop.do(func(now time.Time) []epoch.Output { return d.prop.Step(now, epoch.SetFirstWorld{N: n}) })
}

// WorkerInfo describes a worker the driver knows of.
type WorkerInfo struct {
	Name  string
	Host  string
	PID   int // 0 when the worker did not publish it
	State membership.State
	// Launch is the launcher's name for the worker's process (MetaLaunch;
	// "" for a worker started by hand), how a launcher that starts processes
	// on other hosts, where PIDs repeat, tells its own apart.
	Launch string
	// Gossip is the worker's gossip address ("host:port"), where a driver
	// that takes the job back contacts it (Config.Contact).
	Gossip string
}

func workerInfo(n membership.Node) WorkerInfo {
	pid, _ := strconv.Atoi(n.Meta.Extra[MetaPID])
	var gossip string
	if n.Addr.IsValid() {
		gossip = n.Addr.String()
	}
	return WorkerInfo{Name: n.Name, Host: n.Meta.Host, PID: pid, State: n.Meta.State, Launch: n.Meta.Extra[MetaLaunch], Gossip: gossip}
}

// Workers lists the workers alive in the driver's view, sorted by name.
func (d *Driver) Workers() []WorkerInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.workers)
}

// MetaPID is the membership metadata key under which a worker publishes its
// process id, so a launcher can map members to the processes it started.
const MetaPID = "pid"

// MetaLaunch is the membership metadata key under which a worker publishes
// its launcher's name for it (sync.WorkerConfig.Launch).
const MetaLaunch = "launch"

// Close stops proposing and leaves the cluster.
func (d *Driver) Close() error {
	d.loop.stop()
	d.background.Wait()
	_ = d.m.Leave(context.Background()) // bounded by Membership.LeaveTimeout
	return d.m.Shutdown()
}

// String describes the driver for logs.
func (d *Driver) String() string {
	return fmt.Sprintf("driver of %s at %s", d.cfg.JobID, d.GossipAddr())
}
