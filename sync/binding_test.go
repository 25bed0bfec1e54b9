package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// Session.Collective: broadcasts and allgathers through the session; a peer
// that dies inside one makes the survivors rebuild the world and get
// ErrWorldChanged, and they carry on in the next world; a call refused for
// bad arguments leaves the world intact; ranks that call different
// collectives get a clear error.
func TestSessionCollective(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go coord.Run(ctx)
	ws := []*toyWorker{startToy(t, "c0", coord), startToy(t, "c1", coord), startToy(t, "c2", coord)}
	errs := make([]error, len(ws))
	var wg stdsync.WaitGroup
	for i, w := range ws {
		wg.Go(func() {
			errs[i] = func() error {
				sess, err := joinCoord(ctx, coord, w.name, w.tr, w.state)
				if err != nil {
					return err
				}
				defer sess.Close()
				for sess.Size() != 3 {
					if err := sess.Commit(ctx); err != nil && !errors.Is(err, ErrWorldChanged) {
						return err
					}
				}
				// A root outside the world is refused before anything is sent.
				bad := sess.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
					return collective.Broadcast(ctx, c, make([]float32, 4), 7)
				})
				if bad == nil || errors.Is(bad, ErrWorldChanged) {
					return fmt.Errorf("broadcast from root 7 of 3: %v, want a plain error", bad)
				}
				// A broadcast and an allgather that work.
				v := []float32{float32(sess.Rank()), 1, 2}
				got := make([]float32, 3*sess.Size())
				if err := sess.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
					if err := collective.Broadcast(ctx, c, v, 1); err != nil {
						return err
					}
					return collective.Allgather(ctx, c, v, got)
				}); err != nil {
					return err
				}
				if v[0] != 1 || got[6] != 1 {
					return fmt.Errorf("broadcast gave %v, allgather %v", v, got)
				}
				// c2 dies inside the next allgather (every rank receives from
				// it, directly or relayed); the others rebuild.
				if w.name == "c2" {
					w.tr.Close() // first: the coordinator's probe of this worker then fails
					sess.Communicator().Abort(errors.New("killed"))
					return nil
				}
				err = sess.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
					return collective.Allgather(ctx, c, make([]float64, 1<<14), make([]float64, 3<<14))
				})
				if !errors.Is(err, ErrWorldChanged) {
					return fmt.Errorf("allgather with a dead peer: %v, want ErrWorldChanged", err)
				}
				if !strings.Contains(err.Error(), "(") {
					return fmt.Errorf("ErrWorldChanged without its cause: %v", err)
				}
				if sess.Size() != 2 {
					return fmt.Errorf("world of %d after the failure, want 2", sess.Size())
				}
				// Mismatched collectives: a clear error on the rank that sees it.
				n := 10 + 5*sess.Rank()
				err = sess.Collective(ctx, func(ctx context.Context, c *collective.Communicator) error {
					return collective.Allgather(ctx, c, make([]float32, n), make([]float32, 2*n))
				})
				var mismatch *collective.MismatchError
				if !errors.As(err, &mismatch) && !errors.Is(err, ErrWorldChanged) {
					return fmt.Errorf("mismatched allgathers: %v", err)
				}
				if errors.As(err, &mismatch) && !strings.Contains(err.Error(), "tensors differ") {
					return fmt.Errorf("mismatch error %q does not say what differs", err)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", ws[i].name, err)
		}
	}
}

// JoinJob without a job in its configuration or environment trains in a
// world of one, whose session runs collectives and commits like a job's.
func TestJoinJobAlone(t *testing.T) {
	if UnderLauncher() {
		t.Skip("started by a launcher")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := NewState()
	m, err := JoinJob(ctx, WorkerConfig{}, st)
	if err != nil {
		t.Fatal(err)
	}
	sess := m.Session()
	if sess.Size() != 1 || sess.Rank() != 0 {
		t.Fatalf("rank %d of %d", sess.Rank(), sess.Size())
	}
	v := []float32{3}
	if err := sess.Allreduce(ctx, Sum(), collective.SliceBuffer(v)); err != nil || v[0] != 3 {
		t.Fatalf("allreduce: %v %v", v, err)
	}
	if err := sess.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.RequestLeave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sess.Commit(ctx); !errors.Is(err, ErrExcluded) {
		t.Fatalf("commit after RequestLeave: %v, want ErrExcluded", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// memberSource.deadLeftOut, what Session.Newest reports: a worker that has
// adopted a newer world reports its number, and that it breaks the
// current one only when it goes on without a member of the current world
// that gossip declared dead (and not heard from since); one that has
// adopted none reports the current world, not breaking.
func TestNewestBreaksOnlyWithoutADeadMember(t *testing.T) {
	world := func(number uint64, names ...string) epoch.World {
		w := epoch.World{Number: number}
		for _, n := range names {
			w.Members = append(w.Members, epoch.Member{Name: n, Addr: n + ":1"})
		}
		return w
	}
	current := world(3, "a", "b", "c")
	for _, tc := range []struct {
		name     string
		adopted  []epoch.World
		dead     []string
		alive    []string // heard from again after dead
		newest   uint64
		breaking bool
	}{
		{"none newer adopted", []epoch.World{current}, nil, nil, 3, false},
		{"none newer, a member dead", []epoch.World{current}, []string{"c"}, nil, 3, false},
		{"a dead member left out", []epoch.World{current, world(4, "a", "b")}, []string{"c"}, nil, 4, true},
		{"left out, not dead (a graceful leave)", []epoch.World{current, world(4, "a", "b")}, nil, nil, 4, false},
		{"a joiner", []epoch.World{current, world(4, "a", "b", "c", "d")}, nil, nil, 4, false},
		{"dead but kept", []epoch.World{current, world(4, "a", "b", "c", "d")}, []string{"c"}, nil, 4, false},
		{"dead, then heard from", []epoch.World{current, world(4, "a", "b")}, []string{"c"}, []string{"c"}, 4, false},
		{"dead outside the current world", []epoch.World{current, world(4, "a", "b", "c")}, []string{"x"}, nil, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemberSource(slog.New(slog.DiscardHandler))
			for _, w := range tc.adopted {
				s.onEpoch(w)
			}
			for _, n := range tc.dead {
				s.peerFailed(n)
			}
			for _, n := range tc.alive {
				s.peerAlive(n)
			}
			newest, breaking := s.deadLeftOut(current)
			if newest != tc.newest || breaking != tc.breaking {
				t.Fatalf("newest %d, breaking %v; want %d, %v", newest, breaking, tc.newest, tc.breaking)
			}
		})
	}
}

// memberSource.leftOf, what Session.Left reports: the ranks in the current
// world of the members that left the gossip cluster gracefully and were
// not heard from again, whether or not a newer world leaves them out; a
// member declared dead is not among them (it failed: Newest's business),
// nor one outside the current world.
func TestLeftReportsMembersThatSaidGoodbye(t *testing.T) {
	current := epoch.World{Number: 3}
	for _, n := range []string{"a", "b", "c"} {
		current.Members = append(current.Members, epoch.Member{Name: n, Addr: n + ":1"})
	}
	for _, tc := range []struct {
		name       string
		left, dead []string
		alive      []string // heard from again after left
		want       []int
	}{
		{"none left", nil, nil, nil, nil},
		{"one left", []string{"c"}, nil, nil, []int{2}},
		{"two left, in rank order", []string{"c", "a"}, nil, nil, []int{0, 2}},
		{"dead, not left", nil, []string{"b"}, nil, nil},
		{"left, then heard from", []string{"c"}, nil, []string{"c"}, nil},
		{"left outside the current world", []string{"x"}, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemberSource(slog.New(slog.DiscardHandler))
			s.onEpoch(current)
			for _, n := range tc.left {
				s.peerLeft(n)
			}
			for _, n := range tc.dead {
				s.peerFailed(n)
			}
			for _, n := range tc.alive {
				s.peerAlive(n)
			}
			if got := s.leftOf(current); !slices.Equal(got, tc.want) {
				t.Fatalf("left ranks %v, want %v", got, tc.want)
			}
		})
	}
}

// memberSource.forgetGone: gossip's verdicts on members in neither the
// newest world nor the session's are dropped, so a long job's churn does
// not pile them up; a verdict on a member of either world stays, as
// abortLeftOut (a suspect the newest world left out, still in the
// session's) and leftOf (the session's world) need it.
func TestForgetGoneKeepsOnlyVerdictsOnTheWorlds(t *testing.T) {
	world := func(n uint64, names ...string) epoch.World {
		w := epoch.World{Number: n}
		for _, name := range names {
			w.Members = append(w.Members, epoch.Member{Name: name, Addr: name + ":1"})
		}
		return w
	}
	for _, tc := range []struct {
		name                   string
		newest, current        epoch.World
		dead, left             []string
		wantSuspects, wantLeft []string
	}{
		{"gone from both", world(5, "a", "b"), world(4, "a", "b"), []string{"x"}, []string{"y"}, nil, nil},
		{"in the session's world only", world(5, "a"), world(4, "a", "b", "c"), []string{"b"}, []string{"c"}, []string{"b"}, []string{"c"}},
		{"in the newest world only", world(5, "a", "b", "c"), world(4, "a"), []string{"b"}, []string{"c"}, []string{"b"}, []string{"c"}},
		{"some of each", world(5, "a", "b"), world(4, "a", "b", "c"), []string{"c", "x"}, []string{"b", "y"}, []string{"c"}, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMemberSource(slog.New(slog.DiscardHandler))
			for _, n := range tc.dead {
				s.peerFailed(n)
			}
			for _, n := range tc.left {
				s.peerLeft(n)
			}
			s.forgetGone(tc.newest, tc.current)
			suspects, left := slices.Sorted(maps.Keys(s.suspects)), slices.Sorted(maps.Keys(s.left))
			if !slices.Equal(suspects, tc.wantSuspects) || !slices.Equal(left, tc.wantLeft) {
				t.Fatalf("suspects %v, left %v; want %v, %v", suspects, left, tc.wantSuspects, tc.wantLeft)
			}
		})
	}
}
