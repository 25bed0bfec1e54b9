package driver_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

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
	// Both accusers' reports of each world must reach the driver before it
	// forms the next (a report about a world already replaced is not
	// counted): the world is formed again once every member answered the
	// census's probe, and on a loaded machine an accuser's answer may
	// arrive before the report it was asked to send first (the agent's
	// loop takes the call later, or the two sends race). Coalesce holds
	// the next world a second after the first report, time enough for the
	// second.
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 2,
		Coalesce: time.Second, ProbeTimeout: probeTimeout,
		Membership: gossipConfig(), Logger: slog.New(newRecords(t)),
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

// A worker that is in view but never answers a probe (its gossip is alive,
// its protocol loop is not) leaves the next world as unanswered, and the
// driver waits Config.ProbeTimeout for its answer first, not the proposer's
// default 500 ms.
func TestDriverWaitsItsProbeTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const wait = 2 * time.Second
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 2,
		ProbeTimeout: wait, Membership: gossipConfig(), Logger: slog.New(newRecords(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ags := []*agent{startAgent(t, ctx, d.GossipAddr(), 2), startAgent(t, ctx, d.GossipAddr(), 2)}
	// The silent worker: a member that no agent serves.
	silent := joinSilent(t, ctx, d.GossipAddr())
	w := ags[0].await(t, "all three are members", func(w epoch.World) bool { return len(w.Members) == 3 })
	start := time.Now()
	ags[0].a.ReportFailure(w.Number, silent.Name(), fmt.Errorf("no data from it"))
	next := ags[0].await(t, "the silent worker gone", func(x epoch.World) bool { return x.Number > w.Number && x.Rank(silent.Name()) < 0 })
	if took := time.Since(start); took < wait {
		t.Fatalf("the silent worker was left out %v after it was blamed (world %d %v), before the driver's probe timeout of %v",
			took, next.Number, names(next), wait)
	}
}
