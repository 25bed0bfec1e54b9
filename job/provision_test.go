package job

import (
	"strconv"
	"testing"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// worldsDriver is a Driver whose Remove proposes the world without the
// worker at once, as the real one does on its own goroutine, and has the
// job follow it there and then: the job's goroutine that follows the worlds
// sees it before the engine's (which would mark the worker removed when it
// stops it).
type worldsDriver struct {
	Driver
	names  []string
	roster *roster
	world  epoch.World
}

func (d *worldsDriver) Workers() []driver.WorkerInfo {
	ws := make([]driver.WorkerInfo, len(d.names))
	for i, name := range d.names {
		ws[i] = driver.WorkerInfo{Name: name, Launch: strconv.Itoa(i)}
	}
	return ws
}

func (d *worldsDriver) Remove(name string) { d.leaveOut(name) }

func (d *worldsDriver) leaveOut(name string) {
	next := epoch.World{Number: d.world.Number + 1}
	for _, m := range d.world.Members {
		if m.Name != name {
			next.Members = append(next.Members, m)
		}
	}
	d.roster.followMembers(d.world, next)
	d.world = next
}

// A worker the autoscaling engine takes out of the job (a scale-down, or a
// straggler's replacement in) is not counted as left out of a world,
// whichever of the job's goroutines sees the world without it first; a
// worker a world leaves out otherwise (declared failed while paused or cut
// off) is.
func TestEngineRemovalIsNoExclusion(t *testing.T) {
	for _, tc := range []struct {
		name         string
		removed      bool // by the engine (cluster.Remove); else left out by the world alone
		wantExcluded int
	}{
		{"removed by the engine", true, 0},
		{"left out of a world", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoster("here", 8)
			d := &worldsDriver{names: []string{"w0", "w1", "w2"}, roster: r}
			for i, name := range d.names {
				r.mu.Lock()
				r.reserveLocked("")
				r.mu.Unlock()
				r.launched(i, WorkerRef{Index: i, PID: 1000 + i}, exitedProc{pid: 1000 + i})
				d.world.Members = append(d.world.Members, epoch.Member{Name: name})
			}
			d.world.Number = 1
			r.learn(d.Workers())
			r.followMembers(epoch.World{}, d.world)
			j := &Job{driver: d, roster: r}
			if tc.removed {
				cluster{j}.Remove("w2")
			} else {
				d.leaveOut("w2")
			}
			for _, w := range r.records() {
				want := 0
				if w.Name == "w2" {
					want = tc.wantExcluded
				}
				if w.Excluded != want {
					t.Errorf("worker %d (%s) left out of a world %d×, want %d", w.Index, w.Name, w.Excluded, want)
				}
			}
		})
	}
}
