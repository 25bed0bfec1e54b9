package job

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorovod/gorovod/job/hosts"
)

// HostWatch is a Discovery over package hosts: a fixed host list (-H,
// --hostfile: hosts.Static) or a host discovery script run every second
// (hosts.Script), minus the hosts blacklisted after losing a worker, each for
// Horovod's cooldown (hosts.Cooldown; for good without one). It implements
// Blacklister.
type HostWatch struct {
	// Source lists the hosts.
	Source hosts.Discovery
	// Watch sets the interval between discoveries (default 1 s) and the
	// blacklist cooldown.
	Watch hosts.WatchConfig
	// OnError, if set, is told of each failed discovery (the hosts stay as
	// they were) and of each blacklisting, as a sentence.
	OnError func(msg string)

	mu    sync.Mutex // orders reports: the last one is always the newest list
	w     *hosts.Watcher
	found func([]Host)
}

// NewHostWatch returns a HostWatch of src with cfg.
func NewHostWatch(src hosts.Discovery, cfg hosts.WatchConfig) *HostWatch {
	return &HostWatch{Source: src, Watch: cfg}
}

// Discover runs the source once (a failure then is the error: a
// misconfigured discovery fails the job at once, as in Horovod), reports the
// hosts, and then every change until ctx ends.
func (h *HostWatch) Discover(ctx context.Context, found func([]Host)) error {
	w, _, err := hosts.Watch(ctx, h.Source, h.Watch)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.w, h.found = w, found
	h.report()
	h.mu.Unlock()
	for c := range w.Changes() {
		if c.Err != nil {
			h.tell(fmt.Sprintf("host discovery failed (keeping the hosts %s): %v", hosts.Format(c.Hosts), c.Err))
			continue
		}
		h.mu.Lock()
		h.report()
		h.mu.Unlock()
	}
	return nil
}

// Blacklist takes host out of the list for its cooldown and reports the
// list without it.
func (h *HostWatch) Blacklist(host string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil {
		return
	}
	c, until := h.w.Blacklist(host)
	if len(c.Removed) == 0 {
		return // blacklisted already, or not a host of the list
	}
	how := "for good"
	if !until.IsZero() {
		how = fmt.Sprintf("until %s", until.Format(time.TimeOnly))
	}
	h.tell(fmt.Sprintf("host %s lost a worker: blacklisted %s", host, how))
	h.report()
}

// report hands the watcher's current list to the runner; called with h.mu
// held, so reports arrive in the order of the changes.
func (h *HostWatch) report() {
	hs := h.w.Hosts()
	out := make([]Host, len(hs))
	for i, x := range hs {
		out[i] = Host{Name: x.Name, Slots: x.Slots}
	}
	h.found(slices.Clip(out))
}

func (h *HostWatch) tell(msg string) {
	if h.OnError != nil {
		h.OnError(msg)
	}
}
