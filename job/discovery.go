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
