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
	names := []string{"a", "b", "c"}
	var held atomic.Bool // set once c is removed: the digest's blob read waits
	lookedLate := make(chan uint64, len(names))
	var wg stdsync.WaitGroup
	errs := make([]error, len(names))
	ctx, coord, trs := reachJob(t, names)
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
			sess, err := openReachSession(ctx, name, trs[name], src, state)
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
	looked := leaveOfC(t, nil, func(looked chan []string, _ <-chan struct{}, _ *Session) bool {
		// b comes to the boundary late, after a look at it if one comes
		// (or after well past reachAfter).
		select {
		case seen := <-looked:
			looked <- seen
		case <-time.After(10 * reachAfter):
		}
		return false
	})
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
	looked := leaveOfC(t, []string{"b"}, func(_ chan []string, aMoving <-chan struct{}, sess *Session) bool {
		// b's process ends at this boundary, once a is past the allreduce
		// that carried the epoch (or after 10 s: a never moved, and the
		// test fails).
		select {
		case <-aMoving:
		case <-time.After(10 * time.Second):
		}
		sess.Close()
		sess.t.Close()
		return true
	})
	select {
	case got := <-looked:
		if !slices.Equal(got, []string{"b"}) {
			t.Fatalf("a looked at %v after its re-key with b failed, want [b]", got)
		}
	default:
		t.Fatal("a never looked at b, whose kept link failed its re-key")
	}
}

// leaveOfC trains members a, b, c and d until c leaves (at a's step 3)
// and returns the looks a made for gone members from then on. At the step
// boundary where the others move on without c, b calls atBoundary first
// (with the looks, and a channel closed once a has handed its links over)
// and ends if it returns true. A look at a member of gone removes that
// member, as the proposer would on the look's report; the others train
// until they are in a world without c and without gone.
func leaveOfC(t *testing.T, gone []string, atBoundary func(looked chan []string, aMoving <-chan struct{}, sess *Session) bool) chan []string {
	t.Helper()
	names := []string{"a", "b", "c", "d"}
	ctx, coord, trs := reachJob(t, names)
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
					for _, n := range names {
						if slices.Contains(gone, n) {
							coord.Remove(n)
						}
					}
				}}
			}
			params := make([]float32, 64)
			state := NewState()
			state.RegisterTensor("params", params)
			sess, err := openReachSession(ctx, name, trs[name], s, state)
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
				if name == "b" && sess.newest > sess.epoch.Number && atBoundary(looked, aMoving, sess) {
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
				if removed.Load() && !slices.ContainsFunc(append([]string{"c"}, gone...), func(n string) bool { return sess.World().Rank(n) >= 0 }) {
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
	return looked
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

// reachJob starts an in-process coordinator with a TCP transport for each
// of names, all in its first world; ctx ends with the test (30 s at most).
func reachJob(t *testing.T, names []string) (context.Context, *driver.Coordinator, map[string]*tcp.Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 1})
	go coord.Run(ctx)
	trs := make(map[string]*tcp.Transport)
	for _, name := range names {
		tr := listenTCP(t)
		trs[name] = tr
		coord.Add(epoch.Member{Name: name, Addr: tr.Addr()})
	}
	return ctx, coord, trs
}

// openReachSession opens member name's session of a reachJob.
func openReachSession(ctx context.Context, name string, tr *tcp.Transport, src epoch.Source, state *State) (*Session, error) {
	sc := DefaultConfig()
	sc.JobID, sc.Self = "reach-test", epoch.Member{Name: name, Addr: tr.Addr()}
	return openSession(ctx, sc, tr, src, state)
}
