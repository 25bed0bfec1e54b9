package sync

import (
	"context"
	"errors"
	"fmt"
	stdsync "sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
)

// TestSurvivorsKeepTheirLinksAfterAKill: of three workers training, one
// vanishes mid-run (its transport closes and its communicator aborts, as
// when its process is killed). The two survivors' collective fails; each
// salvages its link to the other (collective.Salvage), and the two-member
// world they recover into re-keys that link instead of dialling it again;
// they then train on in step. In the second row the survivors are also
// told of the new world as a Worker tells them when it adopts an epoch
// (Prepare), which connects ahead only the members the failed world did
// not have: none.
func TestSurvivorsKeepTheirLinksAfterAKill(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare bool
	}{
		{"recovery", false},
		{"recovery after Prepare", true},
	} {
		t.Run(tc.name, func(t *testing.T) { survivorsKeepLinks(t, tc.prepare) })
	}
}

func survivorsKeepLinks(t *testing.T, prepare bool) {
	coord := driver.NewCoordinator(driver.CoordinatorConfig{MinWorkers: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go coord.Run(ctx)
	var ws []*toyWorker
	for i := range 3 {
		ws = append(ws, startToy(t, fmt.Sprintf("s%d", i), coord))
	}
	const until, killAt = 12, 4
	rec := &recorder{}
	sessions := make([]*Session, len(ws))
	errs := make([]error, len(ws))
	var wg, opened stdsync.WaitGroup
	opened.Add(len(ws))
	if prepare {
		go func() {
			opened.Wait()
			var after uint64
			for {
				ep, err := coord.View("test").Await(ctx, after)
				if err != nil {
					return
				}
				if len(ep.Members) == 2 {
					for _, s := range sessions[:2] {
						if s != nil {
							s.Prepare(ep)
						}
					}
					return
				}
				after = ep.Number
			}
		}()
	}
	for i, w := range ws {
		wg.Go(func() {
			sess, err := joinCoord(ctx, coord, w.name, w.tr, w.state, func(c *Config) { c.FusionBytes = 4096 })
			sessions[i] = sess
			opened.Done()
			if err != nil {
				errs[i] = err
				return
			}
			var vanish func(int64) bool
			if i == 2 {
				vanish = func(step int64) bool { return step == killAt }
			}
			errs[i] = toyLoop(ctx, sess, w.name, w.params, until, rec, vanish, func() {
				w.tr.Close()
				sess.Communicator().Abort(errors.New("killed"))
			})
		})
	}
	wg.Wait()
	for _, s := range sessions {
		if s != nil {
			defer s.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, s := range sessions[:2] {
		if s.Size() != 2 {
			t.Fatalf("survivor %d ended in a world of %d", i, s.Size())
		}
		if s.entering.rekeyed != 1 {
			t.Errorf("survivor %d kept %d links from the failed world, want 1 (the other survivor's)", i, s.entering.rekeyed)
		}
	}
	if n := agree(t, rec); n[until] != 2 {
		t.Fatalf("step %d recorded by %d workers, want 2", until, n[until])
	}
}
