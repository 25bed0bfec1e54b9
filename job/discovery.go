package job

import (
	"context"
	"slices"
)

// Host is a machine workers can run on.
type Host struct {
	// Name is how the Launcher reaches it; "" is this host.
	Name string
	// Slots is how many of the job's workers it takes at once; 0 means no
	// limit.
	Slots int
}

// Discovery tells the runner which hosts the job may use: a fixed list
// (StaticHosts), or hosts that come and go (a discovery script polled, a
// cluster manager's allocation).
type Discovery interface {
	// Discover calls found with the whole host list: once as soon as it is
	// known, and again whenever it changes, until ctx ends. It returns when
	// ctx ends (nil), or with an error when it cannot go on; the runner then
	// keeps the last list.
	Discover(ctx context.Context, found func([]Host)) error
}

// StaticHosts is a Discovery of a fixed host list.
func StaticHosts(hosts ...Host) Discovery { return staticHosts(slices.Clone(hosts)) }

type staticHosts []Host

func (s staticHosts) Discover(ctx context.Context, found func([]Host)) error {
	found(slices.Clone(s))
	<-ctx.Done()
	return nil
}

// placement decides where workers go: on the first host, in the discovery's
// order, with a free slot (as Horovod fills hosts), counting the workers of
// the job still running on each.
type placement struct {
	hosts   []Host
	running map[string]int // workers running per host name
}

// pick returns the host for one more worker, or false when every slot is
// taken.
func (p *placement) pick() (string, bool) {
	for _, h := range p.hosts {
		if h.Slots == 0 || p.running[h.Name] < h.Slots {
			return h.Name, true
		}
	}
	return "", false
}

// has reports whether the host is in the current list.
func (p *placement) has(name string) bool {
	return slices.ContainsFunc(p.hosts, func(h Host) bool { return h.Name == name })
}
