package sync

import (
	"context"
	"errors"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/collective/transport/tcp"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// reachWatch is a worker's epoch source that records when the session
// looks for gone members of a world it enters (memberReacher).
type reachWatch struct {
	epoch.Source
	looked chan uint64  // the epoch looked at
	after  *atomic.Bool // records looks only once set (not at the first world's connect)
}

func (r *reachWatch) reachMembers(_ context.Context, ep epoch.World) {
	if !r.after.Load() {
		return
	}
	select {
	case r.looked <- ep.Number:
	default:
	}
}

// Entering a world looks for gone members (one connection to every
// member's gossip port) only while it connects: a member that dies later
// fails the state agreement on its link. Here the links of a world that
// lost a member are all kept, and the state agreement is held up past
// reachAfter by a blob the digest reads (a slow member's state). No look
// may come meanwhile; before, one came at reachAfter, and at 16 workers
// every survivor's look loaded the machine at the moment they all entered.
func TestNoLookForGoneMembersOnceConnected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	names := []string{"a", "b", "c"}
	var held atomic.Bool // set once c is removed: the digest's blob read waits
	lookedLate := make(chan uint64, len(names))
	var wg stdsync.WaitGroup
	errs := make([]error, len(names))
	trs := make(map[string]*tcp.Transport)
	for _, name := range names {
		tr := listenTCP(t)
		trs[name] = tr
		coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
	}
	for i, name := range names {
		wg.Go(func() {
			src := &reachWatch{Source: coord.View(name), looked: make(chan uint64, 4), after: &held}
			params := make([]float32, 64)
			state := NewState()
			state.RegisterTensor("params", params)
			state.RegisterBlob("slow", func() ([]byte, error) {
				if !held.Load() || name == "c" {
					return []byte("x"), nil
				}
				// Connected (the digest runs after the connect): wait for a
				// look, which must not come, for well past reachAfter.
				select {
				case n := <-src.looked:
					lookedLate <- n
				case <-time.After(10 * reachAfter):
				}
				return []byte("x"), nil
			}, func([]byte) error { return nil })
			sc := DefaultConfig()
			sc.JobID, sc.Self = "reach-test", epoch.Member{Name: name, Addr: trs[name].Addr()}
			sess, err := openSession(ctx, sc, trs[name], src, state)
			if err != nil {
				errs[i] = err
				return
			}
			defer sess.Close()
			for {
				g := make([]float32, len(params))
				for j := range g {
					g[j] = 1
				}
				if err := sess.Allreduce(ctx, Sum(), collective.SliceBuffer(g)); err != nil && !errors.Is(err, ErrWorldChanged) {
					errs[i] = err
					return
				}
				err := sess.Commit(ctx)
				switch {
				case errors.Is(err, ErrExcluded) && name == "c":
					return
				case err != nil && !errors.Is(err, ErrWorldChanged):
					errs[i] = err
					return
				}
				if held.Load() && sess.World().Rank("c") < 0 {
					return // in the world without c
				}
				if name == "a" && sess.Size() == 3 && sess.Step() >= 3 && !held.Load() {
					held.Store(true)
					coord.Remove("c")
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	close(lookedLate)
	for n := range lookedLate {
		t.Errorf("a survivor looked for gone members of epoch %d after it had connected", n)
	}
}

// While a world connects for more than reachAfter, a member looks only at
// the members it is dialling, not at those whose links are being re-keyed:
// here c leaves, and b is slow to reach the step boundary, so a's link to
// b waits for b's rekey frame. b is there (a peer that dies closes its
// links, and the re-key fails at once), so a looks at nobody. Before, a
// looked at b, and at 16 workers on a loaded machine every member looked
// at every late one (a stream to each one's gossip port) while they were
// all entering the world.
func TestNoLookAtMembersWithKeptLinks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	names := []string{"a", "b", "c", "d"}
	trs := make(map[string]*tcp.Transport)
	for _, name := range names {
		tr := listenTCP(t)
		trs[name] = tr
		coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
	}
	var removed atomic.Bool
	looked := make(chan []string, 8) // the members a looked at
	var wg stdsync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Go(func() {
			var s epoch.Source = coord.View(name)
			if name == "a" {
				s = &reachList{Source: s, looked: looked, after: &removed}
			}
			params := make([]float32, 64)
			state := NewState()
			state.RegisterTensor("params", params)
			sc := DefaultConfig()
			sc.JobID, sc.Self = "reach-test", epoch.Member{Name: name, Addr: trs[name].Addr()}
			sess, err := openSession(ctx, sc, trs[name], s, state)
			if err != nil {
				errs[i] = err
				return
			}
			defer sess.Close()
			for {
				g := make([]float32, len(params))
				if err := sess.Allreduce(ctx, Sum(), collective.SliceBuffer(g)); err != nil && !errors.Is(err, ErrWorldChanged) {
					errs[i] = err
					return
				}
				if name == "b" && sess.newest > sess.epoch.Number {
					// This commit moves: b comes to the boundary late, after
					// a look at it if one comes (or after well past
					// reachAfter).
					select {
					case seen := <-looked:
						looked <- seen
					case <-time.After(10 * reachAfter):
					}
				}
				err := sess.Commit(ctx)
				switch {
				case errors.Is(err, ErrExcluded) && name == "c":
					return
				case err != nil && !errors.Is(err, ErrWorldChanged):
					errs[i] = err
					return
				}
				if removed.Load() && sess.World().Rank("c") < 0 {
					return
				}
				if name == "a" && sess.Size() == 4 && sess.Step() >= 3 && !removed.Load() {
					removed.Store(true)
					coord.Remove("c")
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-looked:
		t.Fatalf("a looked at %v while b was late to the boundary; its link to b was being re-keyed, want no look", got)
	default:
	}
}

// A member whose kept link fails its re-key is dialled, and looked at
// while it is: here c leaves, and b's process ends at the step boundary
// (its transport closes) before it re-keys anything, so a's re-key with b
// fails, a dials b (refused), and a looks at b. The look reports b gone
// (here: the test removes it, as the proposer would on the report), and a
// and d enter the world without b.
func TestLookAtMemberWhoseKeptLinkFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	names := []string{"a", "b", "c", "d"}
	trs := make(map[string]*tcp.Transport)
	for _, name := range names {
		tr := listenTCP(t)
		trs[name] = tr
		coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
	}
	var removed atomic.Bool
	looked := make(chan []string, 8) // the members a looked at
	aMoving := make(chan struct{})   // a has handed its links over at the boundary
	var wg stdsync.WaitGroup
	errs := make([]error, len(names))
	for i, name := range names {
		wg.Go(func() {
			var s epoch.Source = coord.View(name)
			if name == "a" {
				s = &reachList{Source: s, looked: looked, after: &removed, gone: func(names []string) {
					if slices.Contains(names, "b") {
						coord.Remove("b")
					}
				}}
			}
			params := make([]float32, 64)
			state := NewState()
			state.RegisterTensor("params", params)
			sc := DefaultConfig()
			sc.JobID, sc.Self = "reach-test", epoch.Member{Name: name, Addr: trs[name].Addr()}
			sess, err := openSession(ctx, sc, trs[name], s, state)
			if err != nil {
				errs[i] = err
				return
			}
			if name == "a" {
				var once stdsync.Once
				sess.handedOver = func() {
					if removed.Load() {
						once.Do(func() { close(aMoving) })
					}
				}
			}
			defer sess.Close()
			for {
				g := make([]float32, len(params))
				if err := sess.Allreduce(ctx, Sum(), collective.SliceBuffer(g)); err != nil && !errors.Is(err, ErrWorldChanged) {
					errs[i] = err
					return
				}
				if name == "b" && sess.newest > sess.epoch.Number {
					// b's process ends at this boundary, once a is past
					// the allreduce that carried the epoch.
					select {
					case <-aMoving:
					case <-ctx.Done():
					}
					sess.Close()
					trs["b"].Close()
					return
				}
				err := sess.Commit(ctx)
				switch {
				case errors.Is(err, ErrExcluded) && name == "c":
					return
				case err != nil && !errors.Is(err, ErrWorldChanged):
					errs[i] = err
					return
				}
				if removed.Load() && sess.World().Rank("c") < 0 && sess.World().Rank("b") < 0 {
					return
				}
				if name == "a" && sess.Size() == 4 && sess.Step() >= 3 && !removed.Load() {
					removed.Store(true)
					coord.Remove("c")
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-looked:
		if !slices.Equal(got, []string{"b"}) {
			t.Fatalf("a looked at %v after its re-key with b failed, want [b]", got)
		}
	default:
		t.Fatal("a never looked at b, whose kept link failed its re-key")
	}
}

// reachList is a worker's epoch source that records which members the
// session looks at (memberReacher).
type reachList struct {
	epoch.Source
	looked chan []string
	after  *atomic.Bool         // records looks only once set
	gone   func(names []string) // nil: nothing; else told of each look, as a report of the members gone
}

func (r *reachList) reachMembers(_ context.Context, ep epoch.World) {
	if !r.after.Load() {
		return
	}
	var names []string
	for _, m := range ep.Members {
		names = append(names, m.Name)
	}
	select {
	case r.looked <- names:
	default:
	}
	if r.gone != nil {
		r.gone(names)
	}
}
