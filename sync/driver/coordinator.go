package driver

import (
	"context"
	"log/slog"
	"slices"
	stdsync "sync"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

// CoordinatorConfig configures the epoch proposer.
type CoordinatorConfig struct {
	// Coalesce is how long the proposer waits after a change for more changes,
	// so that workers arriving or failing together cost one transition.
	Coalesce time.Duration
	// MinWorkers: no epoch with fewer members is proposed; the job waits.
	MinWorkers int
	// OnEpoch, if set, is called with every proposed epoch, in order, from the
	// goroutine running Run.
	OnEpoch func(epoch.World)
	Logger  *slog.Logger
}

// Coordinator is the single proposer of world epochs: it turns membership
// changes (joins of ready workers, graceful leaves, failures reported by
// membership or by the collectives) into numbered epochs, each an ordered
// member list. Survivors keep their relative order and joiners are appended,
// so rank 0 of a new epoch is the oldest survivor, which the session copies
// state from.
//
// This in-process form serves workers in the same process through View; the
// launcher's driver runs one and relays its epochs over the membership layer.
type Coordinator struct {
	cfg     CoordinatorConfig
	log     *slog.Logger
	mu      stdsync.Mutex
	members []epoch.Member // desired membership, in rank order
	current epoch.World    // the newest proposed epoch
	dirty   bool
	wake    chan struct{}
	newer   chan struct{} // closed and replaced when an epoch is proposed
}

// NewCoordinator returns a proposer with no members; call Run.
func NewCoordinator(cfg CoordinatorConfig) *Coordinator {
	if cfg.Coalesce <= 0 {
		cfg.Coalesce = 10 * time.Millisecond
	}
	cfg.MinWorkers = max(1, cfg.MinWorkers)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Coordinator{cfg: cfg, log: log, wake: make(chan struct{}, 1), newer: make(chan struct{})}
}

// Add admits a worker that has finished its start-up; it joins at the next epoch.
func (c *Coordinator) Add(m epoch.Member) {
	c.change(func() {
		if !slices.ContainsFunc(c.members, func(x epoch.Member) bool { return x.Name == m.Name }) {
			c.members = append(c.members, m)
		}
	})
}

// Remove drops a worker (graceful leave, scale-down or failure) at the next epoch.
func (c *Coordinator) Remove(name string) {
	c.change(func() {
		c.members = slices.DeleteFunc(c.members, func(x epoch.Member) bool { return x.Name == name })
	})
}

func (c *Coordinator) change(f func()) {
	c.mu.Lock()
	f()
	c.dirty = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// seed makes a proposer that takes over continue from epoch e: numbering
// goes on from it and its members stay in their order.
func (c *Coordinator) seed(e epoch.World) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.Number <= c.current.Number {
		return
	}
	c.current = epoch.World{Number: e.Number, Members: slices.Clone(e.Members)}
	c.members = slices.Clone(e.Members)
}

// setMinWorkers changes the smallest world the coordinator proposes.
func (c *Coordinator) setMinWorkers(n int) {
	c.change(func() { c.cfg.MinWorkers = max(1, n) })
}

// Current returns the newest proposed epoch.
func (c *Coordinator) Current() epoch.World {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Run proposes epochs until ctx ends.
func (c *Coordinator) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			timer.Reset(c.cfg.Coalesce)
		case <-timer.C:
			if e, ok := c.propose(); ok && c.cfg.OnEpoch != nil {
				c.cfg.OnEpoch(e)
			}
		}
	}
}

func (c *Coordinator) propose() (epoch.World, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return epoch.World{}, false
	}
	if len(c.members) < c.cfg.MinWorkers {
		c.log.Info("waiting for enough workers to form a world", "have", len(c.members), "min", c.cfg.MinWorkers)
		return epoch.World{}, false
	}
	if slices.Equal(c.members, c.current.Members) {
		c.dirty = false
		return epoch.World{}, false
	}
	c.dirty = false
	c.current = epoch.World{Number: c.current.Number + 1, Members: slices.Clone(c.members)}
	c.log.Info("proposed", "epoch", c.current.Number, "size", len(c.current.Members))
	close(c.newer)
	c.newer = make(chan struct{})
	return c.current, true
}

// View is the epoch.Source of the worker named name.
func (c *Coordinator) View(name string) epoch.Source { return coordinatorView{c, name} }

type coordinatorView struct {
	c    *Coordinator
	name string
}

func (v coordinatorView) Latest() uint64 { return v.c.Current().Number }

func (v coordinatorView) Await(ctx context.Context, after uint64) (epoch.World, error) {
	for {
		v.c.mu.Lock()
		cur, newer := v.c.current, v.c.newer
		v.c.mu.Unlock()
		if cur.Number > after {
			return cur, nil
		}
		select {
		case <-newer:
		case <-ctx.Done():
			return epoch.World{}, ctx.Err()
		}
	}
}

func (v coordinatorView) ReportFailure(number uint64, peer epoch.Member, cause error) {
	if peer.Name == "" || number != v.c.Current().Number {
		return
	}
	v.c.log.Warn("failure reported", "by", v.name, "blamed", peer.Name, "epoch", number, "err", cause)
	v.c.Remove(peer.Name)
}
