package driver

import (
	"context"
	"log/slog"
	"net"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// CoordinatorConfig configures the in-process epoch proposer.
type CoordinatorConfig struct {
	// Coalesce is how long the proposer waits after a change for more changes,
	// so that workers arriving or failing together cost one transition
	// (default 10 ms).
	Coalesce time.Duration
	// MinWorkers: no epoch with fewer members is proposed; the job waits.
	MinWorkers int
	// OnEpoch, if set, is called with every proposed epoch, in order, from the
	// goroutine running Run.
	OnEpoch func(epoch.World)
	Logger  *slog.Logger
}

// inProcessReannounce: workers in the same process read the coordinator's
// epochs directly; nothing is lost, so nothing needs announcing again.
const inProcessReannounce = 24 * time.Hour

// Coordinator is an in-process epoch proposer for workers in the same
// process (tests, benchmarks): a thin loop around an epoch.Proposer whose
// workers read its epochs through View. Add and Remove stand for the
// membership layer. A blamed worker is probed by dialling its collective
// transport's address: a worker that vanished closed its listener and is
// removed, one that is there keeps its place. (Removing every blamed worker
// at once, without a probe, loses healthy ones: a survivor that aborts its
// links when a peer dies is blamed by its neighbours too.)
type Coordinator struct {
	cfg  CoordinatorConfig
	log  *slog.Logger
	wake chan struct{}

	current epoch.Newest // the newest proposed epoch

	mu      stdsync.Mutex
	prop    *epoch.Proposer
	pending []epoch.World     // proposed, for OnEpoch
	addrs   map[string]string // by worker name: its transport's address, to probe
}

// probeTimeout bounds a probe's dial: on loopback a listener answers at
// once, and a closed one refuses at once.
const probeTimeout = 2 * time.Second

// NewCoordinator returns a proposer with no members; call Run.
func NewCoordinator(cfg CoordinatorConfig) *Coordinator {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Coordinator{
		cfg: cfg, log: log, wake: make(chan struct{}, 1), addrs: map[string]string{},
		prop: epoch.NewProposer(epoch.ProposerConfig{Coalesce: cfg.Coalesce, MinWorkers: cfg.MinWorkers, Reannounce: inProcessReannounce, InProcess: true}),
	}
}

// Add admits a worker that has finished its start-up; it joins at the next epoch.
func (c *Coordinator) Add(m epoch.Member) {
	c.mu.Lock()
	c.addrs[m.Name] = m.Addr
	c.mu.Unlock()
	c.step(epoch.PeerSeen{Peer: epoch.Peer{Name: m.Name, Addr: m.Addr, State: epoch.Ready}})
}

// Remove drops a worker (graceful leave, scale-down or failure) at the next epoch.
func (c *Coordinator) Remove(name string) { c.step(epoch.PeerGone{Name: name}) }

func (c *Coordinator) step(in epoch.Input) {
	c.mu.Lock()
	c.carry(c.prop.Step(time.Now(), in))
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// carry carries out the proposer's outputs, with c.mu held: epochs are
// published to the views, and liveness probes are started.
func (c *Coordinator) carry(outs []epoch.Output) {
	for len(outs) > 0 {
		o := outs[0]
		outs = outs[1:]
		switch o := o.(type) {
		case epoch.Send:
			if o.Msg.Kind == epoch.MsgPing {
				go c.probe(o, c.addrs[o.To])
			}
		case epoch.Proposed:
			c.current.Put(o.World)
			c.pending = append(c.pending, o.World)
			logOutput(c.log, o)
		default:
			logOutput(c.log, o)
		}
	}
}

// probe answers the proposer's ping o for the worker at addr: a pong if its
// transport accepts a connection, a failed send if not.
func (c *Coordinator) probe(o epoch.Send, addr string) {
	if addr != "" {
		if conn, err := net.DialTimeout("tcp", addr, probeTimeout); err == nil {
			conn.Close()
			c.step(epoch.Received{From: o.To, Msg: epoch.Message{Kind: epoch.MsgPong, Nonce: o.Msg.Nonce}})
			return
		}
	}
	c.step(epoch.SendFailed(o))
}

// Current returns the newest proposed epoch.
func (c *Coordinator) Current() epoch.World { return c.current.World() }

// Run proposes epochs until ctx ends.
func (c *Coordinator) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		d := c.prop.Deadline()
		c.mu.Unlock()
		var fire <-chan time.Time
		if !d.IsZero() {
			timer.Reset(time.Until(d))
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-fire:
			c.mu.Lock()
			c.carry(c.prop.Tick(time.Now()))
			proposed := c.pending
			c.pending = nil
			c.mu.Unlock()
			if c.cfg.OnEpoch != nil {
				for _, w := range proposed {
					c.cfg.OnEpoch(w)
				}
			}
		}
	}
}

// View is the epoch.Source of the worker named name.
func (c *Coordinator) View(name string) epoch.Source { return coordinatorView{c, name} }

type coordinatorView struct {
	c    *Coordinator
	name string
}

func (v coordinatorView) Latest() uint64 { return v.c.current.Number() }

func (v coordinatorView) Await(ctx context.Context, after uint64) (epoch.World, error) {
	return v.c.current.Await(ctx, after)
}

func (v coordinatorView) ReportFailure(number uint64, peer epoch.Member, cause error) {
	c := ""
	if cause != nil {
		c = cause.Error()
	}
	v.c.step(epoch.Received{From: v.name, Msg: epoch.Message{Kind: epoch.MsgFailure, Number: number, Blamed: peer.Name, Cause: c}})
}
