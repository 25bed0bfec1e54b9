package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

// Config configures the job's driver: the process (`gorovod run`) that
// proposes world epochs.
type Config struct {
	JobID      string
	Secret     []byte
	MinWorkers int
	// Coalesce: changes closer together than this make one epoch.
	Coalesce time.Duration
	// Membership: gossip settings (bind address, timings); JobID and Secret
	// above override its fields.
	Membership membership.Config
	// OnEpoch and OnStats let an autoscaling engine watch the job: every
	// proposed epoch, in order, and every worker's step statistics. They are
	// called on the driver's proposing goroutine and must not block.
	OnEpoch func(epoch.World)
	OnStats func(worker string, b stats.Batch)
	Logger  *slog.Logger
}

// Driver is the single epoch proposer of an elastic job. It watches the
// membership (workers that become ready, leave or fail) and the failure
// reports of the workers' collectives, turns them into epochs with a
// Coordinator, and sends every epoch to every worker it knows.
type Driver struct {
	cfg    Config
	log    *slog.Logger
	m      *membership.Member
	p      *Proposer
	cancel context.CancelFunc
	done   chan struct{}
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
	d := &Driver{cfg: cfg, log: log, m: m, done: make(chan struct{})}
	d.p = startProposer(m, CoordinatorConfig{Coalesce: cfg.Coalesce, MinWorkers: cfg.MinWorkers}, epoch.World{}, nil,
		proposerHooks{onEpoch: cfg.OnEpoch, onStats: cfg.OnStats}, log)
	runCtx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go d.feed(runCtx)
	return d, nil
}

// feed hands the driver's membership events and messages to its proposer.
func (d *Driver) feed(ctx context.Context) {
	defer close(d.done)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-d.m.Events():
			d.p.events <- ev
		case msg := <-d.m.Messages():
			d.p.messages <- msg
		}
	}
}

// GossipAddr is the driver's membership address: the seed workers join through.
func (d *Driver) GossipAddr() string { return d.m.Local().Addr.String() }

// Current is the newest proposed epoch.
func (d *Driver) Current() epoch.World { return d.p.coord.Current() }

// Finished is closed once a worker of the current world reports that training
// is over (Worker.Finish): workers still waiting to join have nothing left to
// do, and the launcher stops them.
func (d *Driver) Finished() <-chan struct{} { return d.p.finished }

// Unfinished lists the members of the current world that have not reported
// that training is over: after Finished, these are workers still finishing
// the last step (in a world of their own if a collective of it failed for
// them alone), which a launcher should let finish.
func (d *Driver) Unfinished() []string { return d.p.unfinished() }

// Await waits for an epoch numbered above after (for launchers and tests).
func (d *Driver) Await(ctx context.Context, after uint64) (epoch.World, error) {
	return d.p.coord.View("driver").Await(ctx, after)
}

// Remove takes a worker out of the job for good (a scale-down): the next epoch
// leaves it out, its Commit returns ErrExcluded at that step boundary, and it
// is not admitted again.
func (d *Driver) Remove(name string) { d.p.evict(name) }

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
}

// Workers lists the workers alive in the driver's view, sorted by name.
func (d *Driver) Workers() []WorkerInfo {
	nodes := d.p.alive()
	out := make([]WorkerInfo, 0, len(nodes))
	for _, n := range nodes {
		pid, _ := strconv.Atoi(n.Meta.Extra[MetaPID])
		out = append(out, WorkerInfo{Name: n.Name, Host: n.Meta.Host, PID: pid, State: n.Meta.State, Launch: n.Meta.Extra[MetaLaunch]})
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// MetaPID is the membership metadata key under which a worker publishes its
// process id, so a launcher can map members to the processes it started.
const MetaPID = "pid"

// MetaLaunch is the membership metadata key under which a worker publishes
// its launcher's name for it (sync.WorkerConfig.Launch).
const MetaLaunch = "launch"

// Close stops proposing and leaves the cluster.
func (d *Driver) Close() error {
	d.cancel()
	<-d.done
	d.p.Stop()
	_ = d.m.Leave(context.Background()) // bounded by Membership.LeaveTimeout
	return d.m.Shutdown()
}

// String describes the driver for logs.
func (d *Driver) String() string {
	return fmt.Sprintf("driver of %s at %s", d.cfg.JobID, d.GossipAddr())
}
