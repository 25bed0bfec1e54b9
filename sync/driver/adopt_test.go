package driver_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// startAdopting starts a driver that takes the running job back at a new
// address (port 0: not the workers' seed), contacting the workers at
// contact.
func startAdopting(t *testing.T, ctx context.Context, contact []string, log *slog.Logger) *driver.Driver {
	t.Helper()
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 1, ProbeTimeout: probeTimeout,
		Membership: gossipConfig(), Logger: log, Adopt: true, Contact: contact})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestAdoptingDriverAtAnotherAddress: the job's driver is gone, and the
// one that takes the job back listens at another address than the
// workers' seed: it contacts the workers at their gossip addresses, takes
// their world back, and drives the job from there (a worker joining
// through it is admitted).
func TestAdoptingDriverAtAnotherAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 1, ProbeTimeout: probeTimeout, Membership: gossipConfig()})
	if err != nil {
		t.Fatal(err)
	}
	ags := []*agent{startAgent(t, ctx, first.GossipAddr(), 1), startAgent(t, ctx, first.GossipAddr(), 1)}
	w := ags[1].await(t, "both are members", func(w epoch.World) bool { return len(w.Members) == 2 })
	ags[0].await(t, "both are members", func(x epoch.World) bool { return x.Number == w.Number })
	first.Close()

	d := startAdopting(t, ctx, []string{ags[0].m.Local().Addr.String(), ags[1].m.Local().Addr.String()}, slog.New(newRecords(t)))
	if d.GossipAddr() == first.GossipAddr() {
		t.Fatalf("the adopting driver got the first one's address %s: the test needs another", d.GossipAddr())
	}
	// (A worker may have taken over proposing meanwhile, and numbered a
	// world of the same two.)
	waitUntil(t, "the adopting driver continuing from the workers' world", func() bool {
		return d.Current().Number >= w.Number && len(d.Current().Members) == 2 && len(d.Workers()) == 2
	})
	late := startAgent(t, ctx, d.GossipAddr(), 1)
	three := late.await(t, "the newcomer admitted by the adopting driver", func(x epoch.World) bool { return len(x.Members) == 3 })
	if three.Number <= w.Number {
		t.Fatalf("the adopting driver numbered %d after the workers' %d", three.Number, w.Number)
	}
	for _, ag := range ags {
		ag.await(t, "the newcomer admitted", func(x epoch.World) bool { return x.Number >= three.Number })
		ag.checkIncreasing(t)
	}
}

// TestOlderDriverStepsDown: a driver that took the job back while the one
// it replaced was only cut off (or frozen) meets that one in the view: the
// older stops proposing and leaves (Superseded), the newer one drives the
// job, and the workers follow it alone.
func TestOlderDriverStepsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := startDriver(t, ctx, 1, slog.New(newRecordsOf(t, "the old driver")))
	ags := []*agent{startAgent(t, ctx, old.GossipAddr(), 1), startAgent(t, ctx, old.GossipAddr(), 1)}
	w := ags[1].await(t, "both are members", func(w epoch.World) bool { return len(w.Members) == 2 })
	ags[0].await(t, "both are members", func(x epoch.World) bool { return x.Number == w.Number })

	d := startAdopting(t, ctx, []string{ags[0].m.Local().Addr.String()}, slog.New(newRecords(t)))
	select {
	case <-old.Superseded():
	case <-ctx.Done():
		t.Fatal("the older driver did not step down with a newer one in its view")
	}
	select {
	case <-d.Superseded():
		t.Fatal("the newer driver stepped down too")
	default:
	}
	waitUntil(t, "the newer driver continuing from the workers' world", func() bool {
		return d.Current().Number >= w.Number && len(d.Workers()) == 2
	})
	late := startAgent(t, ctx, d.GossipAddr(), 1)
	three := late.await(t, "the newcomer admitted by the newer driver", func(x epoch.World) bool { return len(x.Members) == 3 })
	for _, ag := range ags {
		ag.await(t, "the newcomer admitted", func(x epoch.World) bool { return x.Number >= three.Number })
		ag.checkIncreasing(t)
	}
	if got := old.Current(); got.Number > w.Number {
		t.Errorf("the older driver proposed epoch %d after the newer one came", got.Number)
	}
}
