package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// Point-to-point between engines: a ring pass (receives posted before the
// sends), a message whose size differs from its receive (that receive fails,
// the world goes on), and a peer that goes away while a receive waits for it
// (the receive fails with ErrWorldChanged once the world is rebuilt; after
// Reset the survivors go on).
func TestPointToPoint(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 3)
	const p = 3
	each(t, es, func(e *Engine) error {
		r := e.Topology().Rank
		got := make([]float32, 5000)
		hr, err := e.Recv((r+p-1)%p, 7, f32(got))
		if err != nil {
			return err
		}
		mine := make([]float32, 5000)
		for i := range mine {
			mine[i] = float32(r*10000 + i)
		}
		if err := waitOn(e)(e.Send((r+1)%p, 7, f32(mine))); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if err := e.Wait(hr, 30*time.Second); err != nil {
			return fmt.Errorf("recv: %w", err)
		}
		for i, v := range got {
			if want := float32(((r+p-1)%p)*10000 + i); v != want {
				return fmt.Errorf("element %d from the previous rank is %v, want %v", i, v, want)
			}
		}
		// A mismatched size fails the receive alone.
		switch r {
		case 0:
			if err := waitOn(e)(e.Send(1, 8, f32(make([]float32, 10)))); err != nil {
				return err
			}
		case 1:
			err := waitOn(e)(e.Recv(0, 8, f32(make([]float32, 11))))
			var sm *collective.SizeMismatchError
			if !errors.As(err, &sm) || sm.Sent != 40 || sm.Receiving != 44 {
				return fmt.Errorf("a receive of 11 floats for a message of 10: %v", err)
			}
		}
		v := []float32{1}
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum})); err != nil || v[0] != p {
			return fmt.Errorf("allreduce after the messages: %v %v", v, err)
		}
		if _, err := e.Send(r, 1, f32(v)); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("a send to itself: %v", err)
		}
		if _, err := e.Recv(p, 1, f32(v)); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("a receive from outside the world: %v", err)
		}
		return nil
	})

	victim, survivors := es[2], es[:2]
	handles := make([]Handle, len(survivors))
	for i, e := range survivors {
		h, err := e.Recv(2, 3, f32(make([]float32, 4)))
		if err != nil {
			t.Fatal(err)
		}
		handles[i] = h
	}
	// Both receives are posted (the communicator's pump reads the link) once
	// Recv returned; the victim goes.
	victim.Close(context.Background(), false)
	each(t, survivors, func(e *Engine) error {
		i := slices.Index(survivors, e)
		if err := e.Wait(handles[i], 60*time.Second); !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("a receive from a peer that went away: %v, want ErrWorldChanged", err)
		}
		if top := e.Topology(); top.Size != 2 {
			return fmt.Errorf("topology after the failure: %+v", top)
		}
		if _, err := e.Send(1-e.Topology().Rank, 1, f32(make([]float32, 1))); !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("a send before Reset: %v", err)
		}
		e.Reset()
		r := e.Topology().Rank
		buf := []float32{float32(r)}
		hr, err := e.Recv(1-r, 2, f32(buf))
		if err != nil {
			return err
		}
		if err := waitOn(e)(e.Send(1-r, 2, f32([]float32{float32(r + 100)}))); err != nil {
			return err
		}
		if err := e.Wait(hr, 30*time.Second); err != nil || buf[0] != float32(1-r+100) {
			return fmt.Errorf("a message in the new world: %v %v", buf, err)
		}
		return nil
	})
}

// TestRecvAny: receives from any rank between engines: ranks 1 and 2 each
// send rank 0 a message with tag 4, and rank 0's two RecvAny get one each,
// naming the sender; a Recv made before a RecvAny is matched first; a
// world of one is refused; a peer that goes away while
// the survivors' any-source receives wait fails them with ErrWorldChanged.
func TestRecvAny(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 3)
	each(t, es, func(e *Engine) error {
		r := e.Topology().Rank
		if r != 0 {
			return waitOn(e)(e.Send(0, 4, f32([]float32{float32(r * 10)})))
		}
		seen := map[int32]bool{}
		for range 2 {
			buf := []float32{-1}
			from := int32(-1)
			if err := waitOn(e)(e.RecvAny(4, f32(buf), &from)); err != nil {
				return err
			}
			if (from != 1 && from != 2) || seen[from] || buf[0] != float32(from*10) {
				return fmt.Errorf("RecvAny got %v from rank %d (seen %v)", buf, from, seen)
			}
			seen[from] = true
		}
		if _, err := e.RecvAny(4, f32(make([]float32, 1)), nil); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("RecvAny with no place for the source: %v", err)
		}
		return nil
	})
	// Receives are posted in the order they were made: a Recv from rank 1
	// made before a RecvAny takes rank 1's first message, the RecvAny its
	// second, every time.
	each(t, es, func(e *Engine) error {
		const rounds = 20
		switch e.Topology().Rank {
		case 1:
			for i := range 2 * rounds {
				if err := waitOn(e)(e.Send(0, 5, f32([]float32{float32(i)}))); err != nil {
					return err
				}
			}
		case 0:
			for i := range rounds {
				first, second := []float32{-1}, []float32{-1}
				from := int32(-1)
				h1, err := e.Recv(1, 5, f32(first))
				if err != nil {
					return err
				}
				if err := waitOn(e)(e.RecvAny(5, f32(second), &from)); err != nil {
					return err
				}
				if err := e.Wait(h1, 30*time.Second); err != nil {
					return err
				}
				if first[0] != float32(2*i) || second[0] != float32(2*i+1) || from != 1 {
					return fmt.Errorf("round %d: the Recv got %v, the RecvAny made after it %v from rank %d", i, first, second, from)
				}
			}
		}
		return nil
	})

	victim, survivors := es[2], es[:2]
	handles := make([]Handle, len(survivors))
	sources := make([]int32, len(survivors))
	for i, e := range survivors {
		h, err := e.RecvAny(3, f32(make([]float32, 4)), &sources[i])
		if err != nil {
			t.Fatal(err)
		}
		handles[i] = h
	}
	victim.Close(context.Background(), false)
	each(t, survivors, func(e *Engine) error {
		i := slices.Index(survivors, e)
		if err := e.Wait(handles[i], 60*time.Second); !errors.Is(err, gsync.ErrWorldChanged) {
			return fmt.Errorf("a receive from any rank when a peer went away: %v, want ErrWorldChanged", err)
		}
		e.Reset()
		if top := e.Topology(); top.Size != 2 {
			return fmt.Errorf("topology after the failure: %+v", top)
		}
		return nil
	})
	alone := startEngines(t, startDriver(t, 1), 1)[0]
	var from int32
	if _, err := alone.RecvAny(0, f32(make([]float32, 1)), &from); !errors.Is(err, ErrInvalid) {
		t.Fatalf("RecvAny in a world of one: %v, want ErrInvalid", err)
	}
}

// TestRecvAnyOn: receives from any member of a process set between
// engines. The set is world ranks 0, 1 and 2 of 4; rank 3, outside it,
// sends rank 0 a message with tag 6 before the set's members send theirs
// (rank 1 two, rank 2 one, after a barrier). Rank 0's three RecvAnyOn,
// made before any message came, take the members' messages only, naming
// them by world rank, rank 1's in the order sent; rank 3's stays for a
// Recv from it. A non-member's, an unknown set's, and a set of this
// process alone are refused.
func TestRecvAnyOn(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 4)
	sets := make([]int32, len(es))
	each(t, es, func(e *Engine) error {
		id, err := addSet(e, 0, 1, 2)
		sets[e.Topology().Rank] = id
		return err
	})
	set := sets[0]
	each(t, es, func(e *Engine) error {
		const tag = 6
		w := waitOn(e)
		r := e.Topology().Rank
		switch r {
		case 3:
			if err := w(e.Send(0, tag, f32([]float32{30}))); err != nil {
				return err
			}
			return w(e.Barrier())
		case 1, 2:
			if err := w(e.Barrier()); err != nil {
				return err
			}
			for k := range 3 - r {
				if err := w(e.Send(0, tag, f32([]float32{float32(r*10 + k)}))); err != nil {
					return err
				}
			}
			return nil
		}
		bufs := make([][]float32, 3)
		froms := make([]int32, 3)
		handles := make([]Handle, 3)
		for i := range handles {
			bufs[i], froms[i] = []float32{-1}, -1
			h, err := e.RecvAnyOn(set, tag, f32(bufs[i]), &froms[i])
			if err != nil {
				return err
			}
			handles[i] = h
		}
		if err := w(e.Barrier()); err != nil {
			return err
		}
		got := map[int32]int{}
		for i, h := range handles {
			if err := e.Wait(h, 30*time.Second); err != nil {
				return err
			}
			from := froms[i]
			if (from != 1 && from != 2) || bufs[i][0] != float32(from*10)+float32(got[from]) {
				return fmt.Errorf("receive %d from any member of set %d got %v from rank %d (so far %v)", i, set, bufs[i], from, got)
			}
			got[from]++
		}
		if got[1] != 2 || got[2] != 1 {
			return fmt.Errorf("receives from any member of set %d got messages from %v, want 2 from rank 1 and 1 from rank 2", set, got)
		}
		from3 := []float32{-1}
		if err := w(e.Recv(3, tag, f32(from3))); err != nil || from3[0] != 30 {
			return fmt.Errorf("the Recv from rank 3 after them got %v, %v; want its message, 30", from3, err)
		}
		return nil
	})
	alone := make([]int32, len(es))
	each(t, es, func(e *Engine) error {
		id, err := addSet(e, 1)
		alone[e.Topology().Rank] = id
		return err
	})
	each(t, es, func(e *Engine) error {
		r := e.Topology().Rank
		for _, tc := range []struct {
			name  string
			ranks []int // where the call is made
			set   int32
			want  error
		}{
			{"not a member", []int{3}, set, ErrNotMember},
			{"unknown set", []int{0, 1, 2, 3}, 9999, ErrUnknownSet},
			{"this process alone", []int{1}, alone[r], ErrInvalid},
			{"no place for the source", []int{0}, set, ErrInvalid},
		} {
			if !slices.Contains(tc.ranks, r) {
				continue
			}
			source := new(int32)
			if tc.name == "no place for the source" {
				source = nil
			}
			if _, err := e.RecvAnyOn(tc.set, 0, f32(make([]float32, 1)), source); !errors.Is(err, tc.want) {
				return fmt.Errorf("%s: RecvAnyOn(%d) returned %v, want %v", tc.name, tc.set, err, tc.want)
			}
		}
		return nil
	})
}
