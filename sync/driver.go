package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/membership"
)

// probeTimeout bounds the liveness check of a worker blamed for a failure.
const probeTimeout = 500 * time.Millisecond

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
	cfg   DriverConfig
	log   *slog.Logger
	m     *membership.Member
	coord *Coordinator

	mu      stdsync.Mutex
	workers map[string]membership.Node // alive workers, by name
	probes  map[uint64]chan struct{}   // liveness checks waiting for a pong
	nonce   uint64
	epochs  chan Epoch
	cancel  context.CancelFunc
	done    chan struct{}
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
	d := &Driver{cfg: cfg, log: log, m: m, workers: map[string]membership.Node{}, probes: map[uint64]chan struct{}{}, epochs: make(chan Epoch, 64), done: make(chan struct{})}
	d.coord = NewCoordinator(CoordinatorConfig{
		Coalesce: cfg.Coalesce, MinWorkers: cfg.MinWorkers, Logger: log,
		OnEpoch: func(e Epoch) { d.epochs <- e },
	})
	runCtx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go d.coord.Run(runCtx)
	go d.loop(runCtx)
	return d, nil
}

// GossipAddr is the driver's membership address: the seed workers join through.
func (d *Driver) GossipAddr() string { return d.m.Local().Addr.String() }

// Current is the newest proposed epoch.
func (d *Driver) Current() Epoch { return d.coord.Current() }

// Await waits for an epoch numbered above after (for launchers and tests).
func (d *Driver) Await(ctx context.Context, after uint64) (Epoch, error) {
	return d.coord.View("driver").Await(ctx, after)
}

// Close stops proposing and leaves the cluster.
func (d *Driver) Close() error {
	d.cancel()
	<-d.done
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = d.m.Leave(ctx)
	return d.m.Shutdown()
}

// reannounce is how often the current epoch is sent again to every worker:
// gossip messages may be lost or reordered, and a worker that missed its
// epoch would wait for it forever.
const reannounce = time.Second

func (d *Driver) loop(ctx context.Context) {
	defer close(d.done)
	tick := time.NewTicker(reannounce)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if cur := d.coord.Current(); cur.Number > 0 {
				go d.announce(ctx, cur)
			}
		case ev := <-d.m.Events():
			d.onEvent(ctx, ev)
		case msg := <-d.m.Messages():
			d.onMessage(ctx, msg)
		case e := <-d.epochs:
			d.announce(ctx, e)
		}
	}
}

func (d *Driver) onEvent(ctx context.Context, ev membership.Event) {
	n := ev.Node
	if n.Meta.Role != membership.RoleWorker {
		return
	}
	switch ev.Kind {
	case membership.EventJoined, membership.EventUpdated:
		d.mu.Lock()
		d.workers[n.Name] = n
		d.mu.Unlock()
		switch n.Meta.State {
		case membership.StateReady:
			if n.Meta.CollectiveAddr == "" {
				d.log.Warn("ready worker without a collective address", "worker", n.Name)
				return
			}
			d.coord.Add(Member{Name: n.Name, Addr: n.Meta.CollectiveAddr})
			// Tell it where the job stands, so it knows which epoch to wait past.
			if cur := d.coord.Current(); cur.Number > 0 {
				go d.send(ctx, n, encodeEpoch(cur))
			}
		case membership.StateLeaving:
			d.coord.Remove(n.Name)
		}
	case membership.EventLeft, membership.EventFailed:
		d.log.Info("worker gone", "worker", n.Name, "how", ev.Kind)
		d.mu.Lock()
		delete(d.workers, n.Name)
		d.mu.Unlock()
		d.coord.Remove(n.Name)
	}
}

func (d *Driver) onMessage(ctx context.Context, msg membership.Message) {
	cm, err := decodeControl(msg.Payload)
	switch {
	case err != nil:
		d.log.Warn("dropped control message", "from", msg.From.Name, "err", err)
	case cm.Type == msgPong:
		d.mu.Lock()
		if ch, ok := d.probes[cm.Nonce]; ok {
			close(ch)
			delete(d.probes, cm.Nonce)
		}
		d.mu.Unlock()
	case cm.Type == msgFailure:
		if cm.Blamed == "" || cm.Number != d.coord.Current().Number {
			return
		}
		d.log.Warn("collective failure reported", "by", msg.From.Name, "blamed", cm.Blamed, "epoch", cm.Number, "cause", cm.Cause)
		go d.verify(ctx, cm.Blamed)
	}
}

// verify removes a worker blamed for a collective failure unless it proves to
// be alive. Blame is only a suspicion: when one worker dies, a neighbour of a
// survivor that aborted sees that survivor's links close too, and blames it.
func (d *Driver) verify(ctx context.Context, name string) {
	d.mu.Lock()
	n, ok := d.workers[name]
	d.nonce++
	nonce := d.nonce
	pong := make(chan struct{})
	d.probes[nonce] = pong
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		delete(d.probes, nonce)
		d.mu.Unlock()
	}()
	if !ok {
		d.coord.Remove(name)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := d.m.Send(ctx, n, encodePing(msgPing, nonce)); err == nil {
		select {
		case <-pong:
			d.log.Info("blamed worker is alive", "worker", name)
			return
		case <-ctx.Done():
		}
	}
	d.log.Warn("blamed worker does not answer; removing it", "worker", name)
	d.coord.Remove(name)
}

// announce sends epoch e to every alive worker: its members, and the workers it
// leaves out, who learn that they are out.
func (d *Driver) announce(ctx context.Context, e Epoch) {
	payload := encodeEpoch(e)
	d.mu.Lock()
	targets := make([]membership.Node, 0, len(d.workers))
	for _, n := range d.workers {
		targets = append(targets, n)
	}
	d.mu.Unlock()
	var wg stdsync.WaitGroup
	for _, n := range targets {
		wg.Go(func() { d.send(ctx, n, payload) })
	}
	wg.Wait()
}

func (d *Driver) send(ctx context.Context, n membership.Node, payload []byte) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := d.m.Send(ctx, n, payload); err != nil {
		d.log.Warn("could not send an epoch", "worker", n.Name, "err", err)
	}
}

// String describes the driver for logs.
func (d *Driver) String() string {
	return fmt.Sprintf("driver of %s at %s", d.cfg.JobID, d.GossipAddr())
}
