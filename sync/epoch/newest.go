package epoch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Newest holds the newest world a process knows, for any number of readers:
// a number read at every step boundary without a lock, and waits for a newer
// one. The zero value holds no world. It is safe for concurrent use.
type Newest struct {
	number atomic.Uint64
	mu     sync.Mutex
	world  World
	newer  chan struct{} // closed and replaced when a newer world is put
}

// Put keeps w if it is newer than the world held, and wakes the waiters; it
// reports whether it did.
func (n *Newest) Put(w World) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w.Number <= n.world.Number {
		return false
	}
	n.world = w
	n.number.Store(w.Number)
	if n.newer != nil {
		close(n.newer)
		n.newer = nil
	}
	return true
}

// Number is the held world's number (0 when none).
func (n *Newest) Number() uint64 { return n.number.Load() }

// World is the held world.
func (n *Newest) World() World {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.world
}

// Await returns the held world once its number is above after, waiting for
// one until ctx ends.
func (n *Newest) Await(ctx context.Context, after uint64) (World, error) {
	for {
		n.mu.Lock()
		w := n.world
		if n.newer == nil {
			n.newer = make(chan struct{})
		}
		newer := n.newer
		n.mu.Unlock()
		if w.Number > after {
			return w, nil
		}
		select {
		case <-newer:
		case <-ctx.Done():
			return World{}, ctx.Err()
		}
	}
}
