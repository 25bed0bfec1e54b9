package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorovod/gorovod/collective"
	gsync "github.com/gorovod/gorovod/sync"
)

// A step of a rank's script in TestNamedCallsPairByName: it submits a call
// (asynchronously) and names it in handles, or waits for handles named
// before. submit returns the call's handle and what checks its result.
type step struct {
	submit func(e *Engine, rank int) (Handle, func() error, error)
	as     string // the handle's name in the script
	wait   string // wait for this handle instead of submitting
}

// named is an asynchronous allreduce (sum) of n float32s under name, each
// rank contributing rank+1 times base: the sum of 2 ranks is 3 times base.
func named(name string, n int, base float32) step {
	return step{as: name, submit: func(e *Engine, rank int) (Handle, func() error, error) {
		v := make([]float32, n)
		for i := range v {
			v[i] = base * float32(rank+1)
		}
		h, err := e.AllreduceShapedOn(0, nil, []collective.Buffer{f32(v)}, nil, gsync.Reduction{Op: collective.Sum}, Name(name))
		return h, func() error {
			for _, x := range v {
				if x != 3*base {
					return fmt.Errorf("allreduce %q: %v, want %v everywhere", name, v, 3*base)
				}
			}
			return nil
		}, err
	}}
}

func barrierStep(as string) step {
	return step{as: as, submit: func(e *Engine, _ int) (Handle, func() error, error) {
		h, err := e.Barrier()
		return h, func() error { return nil }, err
	}}
}

func waitFor(as string) step { return step{wait: as} }

// Calls named alike pair across the ranks whatever their order in each
// rank's queue (Horovod's pairing by name); the same name with another
// shape still fails on every rank with a MismatchError; a call no other
// rank pairs with fails once Config.PairTimeout has passed, with a
// MismatchError that names it. After each case an unnamed allreduce runs
// in the same world.
func TestNamedCallsPairByName(t *testing.T) {
	d := startDriver(t, 2)
	es := startEngines(t, d, 2)
	type outcome struct {
		field string // "": the call succeeds; else the MismatchError's field
		name  string // what the error must mention
	}
	for _, tc := range []struct {
		name    string
		scripts [2][]step
		want    map[string]outcome // by handle name; every other handle succeeds
	}{
		{
			name: "the same calls in other orders",
			scripts: [2][]step{
				{named("a", 3, 1), named("b", 5, 10), named("c", 1, 100), waitFor("a"), waitFor("b"), waitFor("c")},
				{named("c", 1, 100), named("b", 5, 10), named("a", 3, 1), waitFor("c"), waitFor("a"), waitFor("b")},
			},
		},
		{
			// Horovod's duplicate-name tests: rank 0's named call waits
			// behind the barrier rank 1 called first.
			name: "a barrier overtakes a named call",
			scripts: [2][]step{
				{named("x", 17, 1), barrierStep("b1"), waitFor("b1"), barrierStep("b2"), waitFor("b2"), waitFor("x")},
				{barrierStep("b1"), waitFor("b1"), named("x", 17, 1), barrierStep("b2"), waitFor("b2"), waitFor("x")},
			},
		},
		{
			name: "unnamed calls pair by their order among the unnamed",
			scripts: [2][]step{
				{named("n", 2, 1), barrierStep("b1"), barrierStep("b2"), waitFor("b1"), waitFor("b2"), waitFor("n")},
				{barrierStep("b1"), barrierStep("b2"), named("n", 2, 1), waitFor("b2"), waitFor("n"), waitFor("b1")},
			},
		},
		{
			name: "the same name with another element count fails on every rank",
			scripts: [2][]step{
				{named("y", 4, 1), barrierStep("b"), waitFor("b"), waitFor("y")},
				{barrierStep("b"), named("y", 5, 1), waitFor("b"), waitFor("y")},
			},
			want: map[string]outcome{"y": {field: "element count", name: `"y"`}},
		},
		{
			name: "a call that never pairs fails, named",
			scripts: [2][]step{
				{named("only-on-0", 4, 1), waitFor("only-on-0")},
				{named("only-on-1", 4, 1), waitFor("only-on-1")},
			},
			want: map[string]outcome{"only-on-0": {field: "name", name: `"only-on-0"`}, "only-on-1": {field: "name", name: `"only-on-1"`}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			each(t, es, func(e *Engine) error {
				rank, world := e.Topology().Rank, e.Topology().World
				handles, checks := map[string]Handle{}, map[string]func() error{}
				for _, s := range tc.scripts[rank] {
					if s.wait == "" {
						h, check, err := s.submit(e, rank)
						if err != nil {
							return fmt.Errorf("submitting %s: %v", s.as, err)
						}
						handles[s.as], checks[s.as] = h, check
						continue
					}
					err := waitOn(e)(handles[s.wait], nil)
					want, failing := tc.want[s.wait]
					var mismatch *collective.MismatchError
					switch {
					case !failing && err != nil:
						return fmt.Errorf("%s: %v", s.wait, err)
					case !failing:
						if err := checks[s.wait](); err != nil {
							return err
						}
					case failing && (!errors.As(err, &mismatch) || mismatch.Field != want.field || !strings.Contains(err.Error(), want.name)):
						return fmt.Errorf("%s: want a MismatchError of its %s naming %s, got %v", s.wait, want.field, want.name, err)
					}
				}
				// The next unnamed call runs in the same world.
				v := []float32{float32(rank + 1)}
				if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, gsync.Reduction{Op: collective.Sum})); err != nil {
					return fmt.Errorf("the allreduce after: %v", err)
				}
				if v[0] != 3 || e.Topology().World != world {
					return fmt.Errorf("after: sum %v (want 3), world %d (was %d)", v[0], e.Topology().World, world)
				}
				return nil
			})
		})
	}
}

// On a process set, named calls pair by name among its members, and the
// unnamed calls are numbered per set: ranks 0 and 1 make an unnamed and two
// named allreduces (in opposite orders) on their set while rank 2 makes
// none, and then every rank's unnamed world allreduce pairs with the
// others' at once (with one numbering for every set, rank 2's would be
// number 0 and the others' number 1, and the call would never pair).
func TestNamedCallsOnAProcessSet(t *testing.T) {
	d := startDriver(t, 3)
	es := startEngines(t, d, 3)
	sum := gsync.Reduction{Op: collective.Sum}
	each(t, es, func(e *Engine) error {
		id, err := addSet(e, 0, 1)
		if err != nil {
			return err
		}
		rank := e.Topology().Rank
		if rank < 2 {
			u := []float32{1}
			if err := waitOn(e)(e.AllreduceOn(id, nil, []collective.Buffer{f32(u)}, sum)); err != nil || u[0] != 2 {
				return fmt.Errorf("unnamed allreduce on the set: %v %v", u, err)
			}
			a, b := []float32{float32(rank + 1)}, []float32{10 * float32(rank+1), 0}
			names := []string{"set.a", "set.b"}
			if rank == 1 {
				names = []string{"set.b", "set.a"}
			}
			var hs []Handle
			for _, name := range names {
				buf := a
				if name == "set.b" {
					buf = b
				}
				h, err := e.AllreduceShapedOn(id, nil, []collective.Buffer{f32(buf)}, nil, sum, Name(name))
				if err != nil {
					return err
				}
				hs = append(hs, h)
			}
			for _, h := range hs {
				if err := waitOn(e)(h, nil); err != nil {
					return err
				}
			}
			if a[0] != 3 || b[0] != 30 {
				return fmt.Errorf("named allreduces on the set: %v %v, want 3 and 30", a, b)
			}
		}
		v := []float32{float32(rank)}
		if err := waitOn(e)(e.Allreduce(nil, []collective.Buffer{f32(v)}, sum)); err != nil || v[0] != 3 {
			return fmt.Errorf("the world's allreduce after: %v %v", v, err)
		}
		return nil
	})
}
