package sync

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// TestPrepareConnectsAhead: workers that Prepare the next world while they
// train connect ahead only to its new member, enter it at the step boundary
// with that link and the one between them kept from the last world, a joiner that connects the usual way meets
// them, and the new world reduces correctly. Prepare ignores worlds that are
// not newer or leave the worker out, and Close discards a prepared world.
func TestPrepareConnectsAhead(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2, Coalesce: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go coord.Run(ctx)
	ws := []*toyWorker{startToy(t, "p0", coord), startToy(t, "p1", coord)}
	sessions := make([]*Session, 2)
	errs := make([]error, 2)
	var wg stdsync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { sessions[i], errs[i] = joinCoord(ctx, coord, w.name, w.tr, w.state) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	for _, s := range sessions {
		defer s.Close()
	}
	for sessions[0].Size() != 2 || sessions[1].Size() != 2 {
		commitAll(ctx, t, sessions)
	}
	cur := sessions[0].World()

	// Worlds that are not newer, or leave the worker out, are not prepared.
	for _, ep := range []epoch.World{cur, {Number: cur.Number + 1, Members: []epoch.Member{{Name: "someone", Addr: "127.0.0.1:1"}}}} {
		sessions[0].Prepare(ep)
		sessions[0].mu.Lock()
		next := sessions[0].next
		sessions[0].mu.Unlock()
		if next != nil {
			t.Fatalf("Prepare(%v) prepared a world", ep)
		}
	}
	// The world that leaves p0 out has a joiner: p0 holds its move back
	// for Config.JoinHold, on the clock only (it connects nothing).
	sessions[0].mu.Lock()
	h := sessions[0].hold
	sessions[0].mu.Unlock()
	if h.number != cur.Number+1 || h.ahead != nil || h.until.IsZero() {
		t.Fatalf("a worker left out of a world with a joiner holds %+v, want epoch %d on the clock", h, cur.Number+1)
	}

	// A third worker joins: the two members prepare the world with it while
	// the joiner connects to it the usual way, in openSession.
	j := startToy(t, "p2", coord)
	joined := make(chan error, 1)
	var joiner *Session
	go func() {
		var err error
		joiner, err = joinCoord(ctx, coord, j.name, j.tr, j.state)
		joined <- err
	}()
	next, err := coord.View("p0").Await(ctx, cur.Number)
	if err != nil {
		t.Fatal(err)
	}
	for next.Rank("p2") < 0 {
		if next, err = coord.View("p0").Await(ctx, next.Number); err != nil {
			t.Fatal(err)
		}
	}
	prepared := make([]*preconnect, 2)
	for i, s := range sessions {
		s.Prepare(next)
		s.mu.Lock()
		prepared[i], h = s.next, s.hold
		s.mu.Unlock()
		if prepared[i] == nil || prepared[i].number != next.Number {
			t.Fatalf("worker %d did not prepare epoch %d", i, next.Number)
		}
		if h.number != next.Number || h.ahead != prepared[i] {
			t.Fatalf("worker %d holds %+v, want epoch %d until its links to the joiner are connected", i, h, next.Number)
		}
	}
	for i, p := range prepared {
		select {
		case <-p.done:
		case <-ctx.Done():
			t.Fatalf("worker %d: the prepared world never connected", i)
		}
		if p.err != nil {
			t.Fatalf("worker %d: preparing: %v", i, p.err)
		}
	}
	// The boundary: both move to the world with the joiner, on the
	// communicators connected ahead.
	commitAll(ctx, t, sessions)
	if err := <-joined; err != nil {
		t.Fatalf("joiner: %v", err)
	}
	defer joiner.Close()
	// Each member connected only the joiner ahead, and kept the link to
	// the other member (re-keyed into the new world, not dialled again).
	for i, s := range sessions {
		if s.World().Number != next.Number {
			t.Fatalf("worker %d is in epoch %d, want %d", i, s.World().Number, next.Number)
		}
		joinerRank, otherRank := next.Rank("p2"), next.Rank(ws[1-i].name)
		if l := prepared[i].links; l == nil || l[joinerRank] == nil || l[otherRank] != nil {
			t.Fatalf("worker %d prepared links %v, want one to the joiner (rank %d) alone", i, l, joinerRank)
		}
		if s.entering.rekeyed != 1 {
			t.Fatalf("worker %d kept %d links from the last world, want 1", i, s.entering.rekeyed)
		}
	}
	// The new world works: an allreduce over all three.
	checkSum(ctx, t, append(sessions, joiner))

	// Close discards a world being prepared.
	later := epoch.World{Number: next.Number + 1, Members: next.Members}
	sessions[1].Prepare(later)
	if err := sessions[1].Close(); err != nil {
		t.Fatal(err)
	}
	sessions[1].mu.Lock()
	left := sessions[1].next
	sessions[1].mu.Unlock()
	if left != nil {
		t.Fatal("Close left a world being prepared")
	}
	sessions[1].Prepare(later)
	sessions[1].mu.Lock()
	left = sessions[1].next
	sessions[1].mu.Unlock()
	if left != nil {
		t.Fatal("Prepare after Close prepared a world")
	}
}

// checkSum runs an allreduce of rank+1 over sessions, a world, and fails
// the test unless every one gets the sum.
func checkSum(ctx context.Context, t *testing.T, sessions []*Session) {
	t.Helper()
	n := len(sessions)
	errs := make([]error, n)
	var wg stdsync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			v := []float32{float32(i + 1)}
			errs[i] = s.Allreduce(ctx, Sum(), collective.SliceBuffer(v))
			if want := float32(n * (n + 1) / 2); errs[i] == nil && v[0] != want {
				errs[i] = fmt.Errorf("worker %d: sum %v, want %v", i, v[0], want)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// twoMembers starts workers a and b on coord and returns their sessions
// once both are in a world of two; they are closed at the test's end.
func twoMembers(ctx context.Context, t *testing.T, coord *driver.Coordinator, a, b string, edits ...func(*Config)) []*Session {
	t.Helper()
	ws := []*toyWorker{startToy(t, a, coord), startToy(t, b, coord)}
	sessions := make([]*Session, 2)
	errs := make([]error, 2)
	var wg stdsync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { sessions[i], errs[i] = joinCoord(ctx, coord, w.name, w.tr, w.state, edits...) })
	}
	wg.Wait()
	for _, s := range sessions {
		if s != nil {
			t.Cleanup(func() { s.Close() })
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for sessions[0].Size() != 2 || sessions[1].Size() != 2 {
		commitAll(ctx, t, sessions)
	}
	return sessions
}

// commitAll commits a step on every session at once (a world change is no
// error) and fails the test on any other error.
func commitAll(ctx context.Context, t *testing.T, sessions []*Session) {
	t.Helper()
	errs := make([]error, len(sessions))
	var wg stdsync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			if err := s.Commit(ctx); err != nil && !errors.Is(err, ErrWorldChanged) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareWhileMoving: a Prepare that comes (from the worker's epoch
// watcher) after Commit has handed the last world's links over and before
// the next world is entered plans nothing: s.epoch is then the world being
// left, and a plan made from it would dial the members that world had
// while they keep their links to this worker and re-key them: each end
// would wait for the other until a timeout. The members
// enter the joiner's world keeping the link between them, and it works.
func TestPrepareWhileMoving(t *testing.T) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2, Coalesce: time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go coord.Run(ctx)
	sessions := twoMembers(ctx, t, coord, "m0", "m1")
	cur := sessions[0].World()

	j := startToy(t, "m2", coord)
	joined := make(chan error, 1)
	var joiner *Session
	go func() {
		var err error
		joiner, err = joinCoord(ctx, coord, j.name, j.tr, j.state)
		joined <- err
	}()
	next, err := coord.View("m0").Await(ctx, cur.Number)
	if err != nil {
		t.Fatal(err)
	}
	for next.Rank("m2") < 0 {
		if next, err = coord.View("m0").Await(ctx, next.Number); err != nil {
			t.Fatal(err)
		}
	}

	// Both members take the world change at the step boundary; one (the
	// case that stalled: its peer keeps their link) is asked to prepare
	// the joiner's world in the window between handing its links over and
	// entering it.
	planned := make([]*preconnect, 2)
	hooked := make([]bool, 2)
	for i, s := range sessions {
		s.handedOver = func() {
			hooked[i] = true
			if i != 0 {
				return
			}
			s.Prepare(next)
			s.mu.Lock()
			if planned[i] = s.next; s.next != nil {
				// Reported below; dropped so that the test ends now
				// rather than when the two ends' waits time out.
				s.next.discard()
				s.next = nil
			}
			s.mu.Unlock()
		}
	}
	commitAll(ctx, t, sessions)
	if err := <-joined; err != nil {
		t.Fatalf("joiner: %v", err)
	}
	defer joiner.Close()
	for i, p := range planned {
		if !hooked[i] {
			t.Fatalf("worker %d moved to another world without handing its links over", i)
		}
		if p != nil {
			t.Errorf("worker %d prepared epoch %d between handing its links over and entering the next world", i, p.number)
		}
	}
	for i, s := range sessions {
		if s.World().Number != next.Number {
			t.Fatalf("worker %d is in epoch %d, want %d", i, s.World().Number, next.Number)
		}
		if s.entering.rekeyed != 1 {
			t.Errorf("worker %d kept %d links from the last world, want 1 (the other member's)", i, s.entering.rekeyed)
		}
	}
	checkSum(ctx, t, append(sessions, joiner))
}

// TestJoinHeldUntilConnected: members told of a world with a joiner train on
// in their own world while the links to the joiner are being connected
// (Config.JoinHold), instead of stopping at the next step boundary to wait
// for it; once the joiner connects they move at a step boundary, and the new
// world reduces correctly. With a short hold, members whose joiner has not
// connected move when the hold ends and wait for it at the boundary.
func TestJoinHeldUntilConnected(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold time.Duration
		// stepsHeld: steps the members commit in their own world with the
		// joiner not yet connecting (with a short hold they may move
		// before: the hold's end is a matter of time).
		stepsHeld int
	}{
		{"held until connected", time.Minute, 5},
		{"short hold", time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2, Coalesce: time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			go coord.Run(ctx)
			hold := func(c *Config) { c.JoinHold = tc.hold }
			sessions := twoMembers(ctx, t, coord, "h0", "h1", hold)
			cur := sessions[0].World()

			// The joiner is added to the job, the members learn of the world
			// with it and prepare it (as their worker's epoch watcher does);
			// the joiner itself does not connect yet.
			j := startToy(t, "h2", coord)
			next := cur
			for next.Rank("h2") < 0 {
				var err error
				if next, err = coord.View("h0").Await(ctx, next.Number); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range sessions {
				s.Prepare(next)
			}
			for step := range tc.stepsHeld {
				stepCtx, stepCancel := context.WithTimeout(ctx, 10*time.Second)
				commitAll(stepCtx, t, sessions)
				stepCancel()
				for i, s := range sessions {
					if got := s.World().Number; got != cur.Number {
						t.Fatalf("step %d: worker %d moved to epoch %d before its joiner connected, want to stay in %d", step, i, got, cur.Number)
					}
				}
			}

			// The joiner connects; the members move at a step boundary.
			joined := make(chan error, 1)
			var joiner *Session
			go func() {
				var err error
				joiner, err = joinCoord(ctx, coord, j.name, j.tr, j.state, hold)
				joined <- err
			}()
			for sessions[0].World().Number != next.Number || sessions[1].World().Number != next.Number {
				commitAll(ctx, t, sessions)
			}
			if err := <-joined; err != nil {
				t.Fatalf("joiner: %v", err)
			}
			defer joiner.Close()
			checkSum(ctx, t, append(sessions, joiner))
		})
	}
}
