package collective

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// TestSalvageAfterFailure: a world of 4 over authenticated TCP loses rank
// 3 in the middle of a ring allreduce (its links close, as when its
// process is killed). The survivors' allreduce fails; each salvages its
// links (or, in a row, one of them aborts instead), and the three move
// into a world of 3 through transport.Carry: the links both of whose ends
// salvaged them are re-keyed, not dialled again, even the one on which a
// rank had frames waiting that it never read (the drain reads past them),
// and the new world's allreduce sums right over the kept and the
// redialled links alike.
//
// In the ring rank 0 reads only from rank 3, and rank 2 only from rank 1:
// the links 0–1 and 0–2 end whole every time; the link 1–2 may not, when
// rank 2's send to the dead rank fails between a frame's header from rank
// 1 and its payload (the payload is then abandoned, and the pair dialled
// again), so its two ends only have to agree.
func TestSalvageAfterFailure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keep    bool
		aborter int   // a survivor that aborts instead of salvaging (-1: none)
		kept    []int // links re-keyed into the new world, by rank
		racy    bool  // the link 1–2 may be dialled again (see above)
	}{
		{"all salvage", true, -1, []int{2, 2, 2}, true},
		{"one aborts", true, 1, []int{1, 0, 1}, false},
		{"keep off", false, -1, []int{0, 0, 0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const p = 4
			tcfg := tcp.DefaultConfig()
			tcfg.Secret = []byte("salvage-test-secret")
			tcfg.Security = transport.SecurityAuthenticated
			tcfg.IOTimeout = 10 * time.Second
			trs := make([]*tcp.Transport, p)
			addrs := make([]string, p)
			for r := range trs {
				tr, err := tcp.Listen(tcfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tr.Close() })
				trs[r], addrs[r] = tr, tr.Addr()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			worldOf := func(epoch uint64, rank, size int) transport.World {
				return transport.World{JobID: "salvage", Epoch: epoch, Rank: rank, Addrs: addrs[:size]}
			}
			links := make([][]transport.Link, p)
			errs := make([]error, p)
			var wg sync.WaitGroup
			for r := range p {
				wg.Go(func() { links[r], errs[r] = trs[r].Connect(ctx, worldOf(1, r, p)) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			cfg := Config{Algorithm: AlgorithmRing, KeepLinksOnFailure: tc.keep}
			comms := make([]*Communicator, p)
			for r := range p {
				c, err := NewFromLinks(worldOf(1, r, p), links[r], cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				comms[r] = c
			}
			// Frames rank 0 never reads: in the ring it receives from
			// rank 3 only, so its link from rank 1 still holds them when
			// the world fails.
			for range 2 {
				h := transport.Header{Kind: transport.FrameData, Length: 64}
				if err := comms[1].links[0].Send(ctx, &h, make([]byte, 64)); err != nil {
					t.Fatal(err)
				}
			}
			comms[3].Close() // rank 3 dies
			for r := range p - 1 {
				wg.Go(func() {
					v := make([]float32, 1024)
					errs[r] = Allreduce(ctx, comms[r], v, v, Sum)
				})
			}
			wg.Wait()
			for r := range p - 1 {
				if errs[r] == nil {
					t.Fatalf("rank %d: the allreduce without rank 3 succeeded", r)
				}
			}
			salvaged := make([]*Salvaged, p-1)
			for r := range p - 1 {
				if r == tc.aborter {
					comms[r].Abort(errors.New("test: this rank aborts"))
					continue
				}
				salvaged[r] = comms[r].Salvage(errs[r])
			}
			next := make([]*Communicator, p-1)
			rekeyed := make([]int, p-1)
			for r := range p - 1 {
				wg.Go(func() {
					kept := salvaged[r].Take(ctx, func(q int) bool { return q < p-1 })
					if kept != nil {
						kept = kept[:p-1]
					}
					w := worldOf(2, r, p-1)
					var ls []transport.Link
					ls, rekeyed[r], errs[r] = transport.Carry(ctx, trs[r], w, kept, nil)
					if errs[r] == nil {
						next[r], errs[r] = NewFromLinks(w, ls, Config{})
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs[:p-1]...); err != nil {
				t.Fatal(err)
			}
			for r := range p - 1 {
				t.Cleanup(func() { next[r].Close() })
			}
			if tc.racy && rekeyed[1] == tc.kept[1]-1 && rekeyed[2] == tc.kept[2]-1 {
				t.Log("the link between ranks 1 and 2 was dialled again")
				rekeyed[1], rekeyed[2] = tc.kept[1], tc.kept[2]
			}
			for r := range p - 1 {
				if rekeyed[r] != tc.kept[r] {
					t.Errorf("rank %d: %d links kept, want %d", r, rekeyed[r], tc.kept[r])
				}
			}
			noErrors(t, onAll(t, next, 10*time.Second, func(ctx context.Context, c *Communicator) error {
				v := []float32{float32(c.Rank() + 1), 1}
				if err := Allreduce(ctx, c, v, v, Sum); err != nil {
					return err
				}
				if v[0] != 6 || v[1] != 3 {
					return errors.New("wrong sum in the new world")
				}
				return nil
			}))
		})
	}
}

// TestSalvageRefuses: Salvage keeps nothing of a communicator that has not
// failed, of a subset, or of one without KeepLinksOnFailure; each is
// aborted instead.
func TestSalvageRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		get  func(t *testing.T, comms []*Communicator) *Communicator
	}{
		{"healthy", Config{KeepLinksOnFailure: true}, func(t *testing.T, comms []*Communicator) *Communicator { return comms[0] }},
		{"keep off, failed", Config{}, func(t *testing.T, comms []*Communicator) *Communicator {
			comms[1].Close()
			errs := onAll(t, []*Communicator{comms[0], comms[2]}, 10*time.Second, func(ctx context.Context, c *Communicator) error {
				v := []float32{1}
				return Allreduce(ctx, c, v, v, Sum)
			})
			if errs[0] == nil {
				t.Fatal("the allreduce without rank 1 succeeded")
			}
			return comms[0]
		}},
		{"subset", Config{KeepLinksOnFailure: true}, func(t *testing.T, comms []*Communicator) *Communicator {
			sub, err := comms[0].Subset(1, []int{0, 1})
			if err != nil {
				t.Fatal(err)
			}
			return sub
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, inprocMesh, 3, tc.cfg)
			c := tc.get(t, comms)
			if s := c.Salvage(errors.New("test")); s != nil {
				t.Fatalf("salvaged %v", s.links)
			}
			if c.Err() == nil {
				t.Fatal("the communicator runs on after Salvage")
			}
		})
	}
}
