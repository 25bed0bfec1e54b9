package driver

import (
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/epoch"
)

// DeclareDead hands d's protocol loop gossip's verdict that worker name is
// dead, as memberlist gives it for a live worker starved of CPU under load,
// while the worker runs on: what happens next is the loop's and the
// proposer's doing, over real sockets.
func DeclareDead(d *Driver, name string) {
	l := d.loop
	<-l.do(func(time.Time) []epoch.Output {
		if n, ok := l.nodes[name]; ok {
			l.event(membership.Event{Kind: membership.EventFailed, Node: n, At: time.Now()})
		}
		return nil
	})
}
