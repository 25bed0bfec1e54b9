package job

import (
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
)

// TestUnresponsiveClocks: a running process the driver listed once and no
// longer lists is woken WakeAfter after it was last listed; one never
// listed, half of ElasticTimeout after the first world or its launch; a
// woken one still out is stopped stopAfter after its wake. An adopted
// worker the job's earlier driver listed counts as listed at its adoption.
func TestUnresponsiveClocks(t *testing.T) {
	after := wakeBounds{left: 10 * time.Second, neverJoined: 300 * time.Second}
	const stopAfter = 150 * time.Second
	for _, tc := range []struct {
		name string
		// listedUntil is how long after the first world the driver last
		// listed worker 0 (never when negative); worker 1 is never listed.
		listedUntil time.Duration
		// adopted: worker 0 was listed by the job's earlier driver (its
		// record has a gossip address), at listedUntil, not by this one.
		adopted bool
		// learnedOnly: the driver listed worker 0 (the roster learned its
		// name) but the bound never looked while it did: it paused within
		// a tick of the first world.
		learnedOnly bool
		// at are the times after the first world the bound looks; want its
		// wakes and stops at each, as launch indexes.
		at                   []time.Duration
		wantWoken, wantStops [][]int
	}{
		{name: "left the view", listedUntil: 20 * time.Second,
			at:        []time.Duration{29 * time.Second, 30 * time.Second, 179 * time.Second, 180 * time.Second},
			wantWoken: [][]int{nil, {0}, nil, nil}, wantStops: [][]int{nil, nil, nil, {0}}},
		{name: "adopted, out of the new driver's view", listedUntil: 0, adopted: true,
			at:        []time.Duration{9 * time.Second, 10 * time.Second},
			wantWoken: [][]int{nil, {0}}, wantStops: [][]int{nil, nil}},
		{name: "listed between the bound's looks", listedUntil: 0, learnedOnly: true,
			at:        []time.Duration{9 * time.Second, 10 * time.Second},
			wantWoken: [][]int{nil, {0}}, wantStops: [][]int{nil, nil}},
		{name: "never joined", listedUntil: -1,
			at:        []time.Duration{30 * time.Second, 299 * time.Second, 300 * time.Second, 449 * time.Second, 450 * time.Second},
			wantWoken: [][]int{nil, nil, {0, 1}, nil, nil}, wantStops: [][]int{nil, nil, nil, nil, {0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoster("here", 8)
			for i := range 2 {
				r.mu.Lock()
				r.reserveLocked("")
				r.mu.Unlock()
				r.launched(i, WorkerRef{Index: i, PID: 1000 + i}, exitedProc{pid: 1000 + i})
			}
			from := time.Now().Add(time.Second) // the first world formed after both launched
			listed := []driver.WorkerInfo{{Name: "w0", Launch: "0"}}
			switch {
			case tc.adopted:
				r.listedAt(0, from.Add(tc.listedUntil))
			case tc.learnedOnly:
				r.learn(listed)
			case tc.listedUntil >= 0:
				r.learn(listed)
				r.unresponsive(listed, from, from.Add(tc.listedUntil), after, stopAfter)
			}
			for k, at := range tc.at {
				wake, stop := r.unresponsive(nil, from, from.Add(at), after, stopAfter)
				if got := indexes(wake); !slices.Equal(got, tc.wantWoken[k]) {
					t.Errorf("at %v: woken %v, want %v", at, got, tc.wantWoken[k])
				}
				if got := indexes(stop); !slices.Equal(got, tc.wantStops[k]) {
					t.Errorf("at %v: stopped %v, want %v", at, got, tc.wantStops[k])
				}
			}
		})
	}
}

// indexes are the launch indexes of us, sorted.
func indexes(us []unresponsiveProc) []int {
	var out []int
	for _, u := range us {
		out = append(out, u.ref.Index)
	}
	slices.Sort(out)
	return out
}
