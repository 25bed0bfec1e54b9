package membership

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Node is a snapshot of one member.
type Node struct {
	// Name is the member's name, unique per incarnation: a restarted process is
	// a different Node.
	Name string
	// Addr is the member's gossip address (what Send dials, what Seeds list).
	Addr netip.AddrPort
	// Meta is the member's latest metadata known here.
	Meta Meta
}

// clone deep-copies n, so callers can keep or change what they are handed.
func (n Node) clone() Node {
	n.Meta = n.Meta.Clone()
	return n
}

func (n Node) String() string { return n.Name + "@" + n.Addr.String() }

// EventKind says what happened to a member.
type EventKind uint8

const (
	// EventJoined: the member is new here (or came back after being declared
	// dead; a falsely suspected member that refutes is Joined again).
	EventJoined EventKind = iota + 1
	// EventUpdated: the member published new metadata.
	EventUpdated
	// EventLeft: the member left gracefully (it announced State=leaving or said
	// goodbye before going).
	EventLeft
	// EventFailed: the member was declared dead without announcing a departure:
	// a crash, a kill, a partition, or a process stalled past suspicion.
	EventFailed
)

func (k EventKind) String() string {
	switch k {
	case EventJoined:
		return "joined"
	case EventUpdated:
		return "updated"
	case EventLeft:
		return "left"
	case EventFailed:
		return "failed"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is a change in membership as this member saw it.
type Event struct {
	Kind EventKind
	// Node is the member's state with the event: its new metadata for Joined
	// and Updated, its last known metadata for Left and Failed.
	Node Node
	// At is when memberlist reported the change here (before any queuing), so
	// detection latency can be measured however late the event is read.
	At time.Time
}

func (e Event) String() string { return e.Kind.String() + " " + e.Node.String() }

// eventQueue carries events from memberlist's delegate, which must never
// block, to the Events channel, which a slow reader may not drain.
//
// Overflow policy: the queue holds at most one pending event per member. A
// newer event about a member whose previous event is still undelivered
// replaces it in place (a pending Joined followed by Updated stays Joined with
// the newer metadata). A reader thus always learns each member's latest state
// and may skip intermediate ones, and memory is bounded by the number of
// members ever seen between reads, never by the event rate.
type eventQueue struct {
	mu      sync.Mutex
	order   []string // member names with a pending event, oldest first from head
	head    int
	pending map[string]Event
	wake    chan struct{}

	coalesced atomic.Uint64
}

func newEventQueue() *eventQueue {
	return &eventQueue{pending: make(map[string]Event), wake: make(chan struct{}, 1)}
}

func (q *eventQueue) push(e Event) {
	q.mu.Lock()
	if old, ok := q.pending[e.Node.Name]; ok {
		if old.Kind == EventJoined && e.Kind == EventUpdated {
			e.Kind = EventJoined
		}
		q.pending[e.Node.Name] = e
		q.coalesced.Add(1)
	} else {
		q.pending[e.Node.Name] = e
		q.order = append(q.order, e.Node.Name)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) pop() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.order) {
		return Event{}, false
	}
	name := q.order[q.head]
	q.order[q.head] = ""
	q.head++
	switch {
	case q.head == len(q.order):
		// Drained: start again at the front of the same backing array.
		q.order, q.head = q.order[:0], 0
	case q.head > 64 && q.head > len(q.order)/2:
		// A reader that never quite catches up: compact so the array does not
		// grow with the total number of events.
		n := copy(q.order, q.order[q.head:])
		clear(q.order[n:])
		q.order, q.head = q.order[:n], 0
	}
	e := q.pending[name]
	delete(q.pending, name)
	return e, true
}

func (q *eventQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order) - q.head
}

// pump moves events to out until done closes, then closes out.
func (q *eventQueue) pump(out chan<- Event, done <-chan struct{}) {
	defer close(out)
	for {
		for {
			e, ok := q.pop()
			if !ok {
				break
			}
			select {
			case out <- e:
			case <-done:
				return
			}
		}
		select {
		case <-q.wake:
		case <-done:
			return
		}
	}
}
