package driver_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// A worker blamed by two members for the failures of three worlds in a row
// while it answers every probe is removed as stuck, and the driver tells its
// launcher so (Config.OnRemoved): the worker's process is alive and
// answering, so nothing but its launcher will end it.
func TestDriverReportsAStuckWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type removal struct {
		name string
		why  epoch.Reason
	}
	removed := make(chan removal, 16)
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 2,
		Membership: membership.DefaultConfig(), Logger: slog.New(newRecords(t)),
		OnRemoved: func(name string, why epoch.Reason) { removed <- removal{name, why} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var ags []*agent
	for range 3 {
		ags = append(ags, startAgent(t, ctx, d.GossipAddr(), 2))
	}
	w := ags[0].await(t, "all three are members", func(w epoch.World) bool { return len(w.Members) == 3 })
	stuck := ags[1]
	for range 3 {
		ags[0].a.ReportFailure(w.Number, stuck.name, fmt.Errorf("no data from it"))
		ags[2].a.ReportFailure(w.Number, stuck.name, fmt.Errorf("no data from it"))
		w = ags[0].await(t, "a newer world", func(x epoch.World) bool { return x.Number > w.Number })
		if w.Rank(stuck.name) < 0 {
			break
		}
	}
	if w.Rank(stuck.name) >= 0 || len(w.Members) != 2 {
		t.Fatalf("after three worlds failed blaming %s the world is %v", stuck.name, names(w))
	}
	select {
	case r := <-removed:
		if r.name != stuck.name || r.why != epoch.ReasonStuck {
			t.Fatalf("OnRemoved(%s, %v), want (%s, %v)", r.name, r.why, stuck.name, epoch.ReasonStuck)
		}
	case <-time.After(10 * time.Second): // it is called before the world without the worker is sent
		t.Fatal("the driver never called OnRemoved")
	}
}
