package job

import (
	"maps"
	"testing"
	"time"

	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/sync/epoch"
)

// The driver's stall watch reports a collective that some ranks have waited
// in past the threshold for ranks that have not entered it, once per
// threshold and collective, and nothing else.
func TestStallWatch(t *testing.T) {
	world := epoch.World{Number: 3, Members: []epoch.Member{{Name: "a"}, {Name: "b"}}}
	in := func(rank int, started uint64, d time.Duration) stall.Snapshot {
		return stall.Snapshot{Epoch: 3, Rank: rank, Size: 2, Started: started, InFlight: true, For: d, WaitingOn: -1, Collective: "allreduce"}
	}
	idle := func(rank int, started uint64) stall.Snapshot {
		return stall.Snapshot{Epoch: 3, Rank: rank, Size: 2, Started: started, WaitingOn: -1}
	}
	type look struct {
		worker  string
		snap    stall.Snapshot
		missing map[int]uint64 // the stall reported (nil: none)
	}
	for _, tc := range []struct {
		name      string
		threshold time.Duration
		looks     []look
	}{
		{"below the threshold", time.Second, []look{
			{"b", idle(1, 4), nil}, {"a", in(0, 5, time.Second/2), nil}}},
		{"stuck past the threshold: reported once", time.Second, []look{
			{"b", idle(1, 4), nil}, {"a", in(0, 5, 2*time.Second), map[int]uint64{1: 4}}, {"a", in(0, 5, 3*time.Second), nil}}},
		{"every rank in the collective: not a stall of missing ranks", time.Second, []look{
			{"b", in(1, 5, 2*time.Second), nil}, {"a", in(0, 5, 2*time.Second), nil}}},
		{"the other rank sent no snapshot: none missing", time.Second, []look{
			{"a", in(0, 5, 2*time.Second), nil}}},
		{"a later collective stuck is reported too", time.Second, []look{
			{"b", idle(1, 4), nil}, {"a", in(0, 5, 2*time.Second), map[int]uint64{1: 4}},
			{"b", in(1, 7, 2*time.Second), map[int]uint64{0: 5}}}},
		{"the inspector off", -1, []look{
			{"b", idle(1, 4), nil}, {"a", in(0, 5, 2*time.Second), nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStallWatch(tc.threshold)
			w.world(world)
			for i, l := range tc.looks {
				st, in, ok := w.see(l.worker, l.snap)
				if ok != (l.missing != nil) {
					t.Fatalf("look %d (%s): reported %v (%+v), want %v", i, l.worker, ok, st, l.missing != nil)
				}
				if !ok {
					continue
				}
				if !maps.Equal(st.Missing, l.missing) || in.Number != world.Number {
					t.Fatalf("look %d (%s): stall %+v in world %d, want missing %v in world %d", i, l.worker, st, in.Number, l.missing, world.Number)
				}
			}
		})
	}
}
