package job

import (
	"sync"

	"github.com/gorovod/gorovod/sync/epoch"
)

// inbox is what Job.supervise has yet to act on: the worlds the driver
// proposed, the hosts the Discovery dropped and the members the driver
// removed as stuck. They are raised on the driver's and the Discovery's
// goroutines, which must not wait for supervise: each is queued here and
// supervise is woken, and takes them all at its next look. Its mutex
// guards only the queues; nothing is decided on them together with the
// roster's state.
type inbox struct {
	mu      sync.Mutex
	worlds  []epoch.World // proposed, not yet handled
	dropped []string      // hosts the Discovery dropped, not yet handled
	stuck   []string      // members the driver removed as stuck, not yet handled

	poke chan struct{} // supervise looks
}

func newInbox() *inbox { return &inbox{poke: make(chan struct{}, 1)} }

// addWorld queues a proposed world.
func (b *inbox) addWorld(w epoch.World) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.worlds = append(b.worlds, w)
}

// addDropped queues hosts the Discovery no longer lists.
func (b *inbox) addDropped(hosts []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropped = append(b.dropped, hosts...)
}

// addStuck queues a member the driver removed as stuck.
func (b *inbox) addStuck(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stuck = append(b.stuck, name)
}

// wake has supervise look (once, however often it is woken before).
func (b *inbox) wake() {
	select {
	case b.poke <- struct{}{}:
	default:
	}
}

// take takes the worlds, dropped hosts and stuck members queued since the
// last call.
func (b *inbox) take() (worlds []epoch.World, dropped, stuck []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	worlds, dropped, stuck = b.worlds, b.dropped, b.stuck
	b.worlds, b.dropped, b.stuck = nil, nil, nil
	return worlds, dropped, stuck
}
