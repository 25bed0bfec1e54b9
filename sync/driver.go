package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorovod/gorovod/membership"
)

// DriverConfig configures the job's driver: the process (`gorovod run`) that
// proposes world epochs.
type DriverConfig struct {
	JobID      string
	Secret     []byte
	MinWorkers int
	// Coalesce: changes closer together than this make one epoch.
	Coalesce time.Duration
	// Membership: gossip settings (bind address, timings); JobID and Secret
	// above override its fields.
	Membership membership.Config
	Logger     *slog.Logger
}

// Driver is the single epoch proposer of an elastic job. It watches the
// membership (workers that become ready, leave or fail) and the failure
// reports of the workers' collectives, turns them into epochs with a
// Coordinator, and sends every epoch to every worker it knows.
type Driver struct {
	cfg    DriverConfig
	log    *slog.Logger
	m      *membership.Member
	p      *proposer
	cancel context.CancelFunc
	done   chan struct{}
}

// StartDriver joins the gossip cluster as its first member (the workers use
// GossipAddr as their seed) and starts proposing.
func StartDriver(ctx context.Context, cfg DriverConfig) (*Driver, error) {
	if cfg.JobID == "" || len(cfg.Secret) == 0 {
		return nil, errors.New("sync: DriverConfig needs JobID and Secret")
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
	d.p = startProposer(m, CoordinatorConfig{Coalesce: cfg.Coalesce, MinWorkers: cfg.MinWorkers}, Epoch{}, nil, log)
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
func (d *Driver) Current() Epoch { return d.p.coord.Current() }

// Finished is closed once a worker of the current world reports that training
// is over (Worker.Finish): workers still waiting to join have nothing left to
// do, and the launcher stops them.
func (d *Driver) Finished() <-chan struct{} { return d.p.finished }

// Await waits for an epoch numbered above after (for launchers and tests).
func (d *Driver) Await(ctx context.Context, after uint64) (Epoch, error) {
	return d.p.coord.View("driver").Await(ctx, after)
}

// Close stops proposing and leaves the cluster.
func (d *Driver) Close() error {
	d.cancel()
	<-d.done
	d.p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = d.m.Leave(ctx)
	return d.m.Shutdown()
}

// String describes the driver for logs.
func (d *Driver) String() string {
	return fmt.Sprintf("driver of %s at %s", d.cfg.JobID, d.GossipAddr())
}
