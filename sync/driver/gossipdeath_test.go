package driver_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// TestGossipDeathIsProbed: gossip's verdict that a worker is dead is probed
// before the worker is removed, as a blame is. A live worker answers the
// ping sent to where it was (memberlist no longer lists it) and keeps its
// place: no new world. One that is silent (its gossip port takes the ping,
// nothing answers: a stopped process) is removed as failed once the probe
// times out. One whose process is gone refuses the ping and is removed at
// once, before the probe could time out.
func TestGossipDeathIsProbed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	log := newRecords(t)
	removed := make(chan string, 8)
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 1,
		ProbeTimeout: probeTimeout, Membership: gossipConfig(), Logger: slog.New(log),
		OnRemoved: func(name string, why epoch.Reason) { removed <- name + " " + why.String() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var ags []*agent
	for range 3 {
		ags = append(ags, startAgent(t, ctx, d.GossipAddr(), 1))
	}
	silent := joinSilent(t, ctx, d.GossipAddr())
	var w epoch.World
	for _, ag := range ags {
		w = ag.await(t, "all four are members", func(w epoch.World) bool { return len(w.Members) == 4 })
	}

	// Alive: it answers, and stays.
	live := ags[1].name
	driver.DeclareDead(d, live)
	waitUntil(t, "the live worker's answer", func() bool {
		for _, l := range log.lines() {
			if strings.Contains(l, "blamed worker is alive") && strings.Contains(l, "worker="+live) {
				return true
			}
		}
		return false
	})
	select {
	case r := <-removed:
		t.Fatalf("removed %s, want no one removed: %s answered its probe", r, live)
	default:
	}
	if got := d.Current(); !got.Equal(w) {
		t.Fatalf("the world is %v after %s answered, want %v still", got, live, w)
	}

	// Silent: removed as failed once its probe times out.
	start := time.Now()
	driver.DeclareDead(d, silent.Name())
	select {
	case r := <-removed:
		if want := silent.Name() + " " + epoch.ReasonFailed.String(); r != want {
			t.Fatalf("removed %q, want %q", r, want)
		}
		t.Logf("the silent worker was removed %v after gossip's verdict (probe timeout %v)", time.Since(start), probeTimeout)
	case <-ctx.Done():
		t.Fatal("the silent worker was never removed")
	}

	// Gone: its ping is refused, and it is out at once.
	gone := ags[2]
	gone.a.Stop()
	_ = gone.m.Shutdown()
	start = time.Now()
	driver.DeclareDead(d, gone.name)
	select {
	case r := <-removed:
		if want := gone.name + " " + epoch.ReasonFailed.String(); r != want {
			t.Fatalf("removed %q, want %q", r, want)
		}
		if took := time.Since(start); took >= probeTimeout {
			t.Fatalf("the dead worker was removed %v after gossip's verdict: it waited for the probe timeout (%v)", took, probeTimeout)
		}
	case <-ctx.Done():
		t.Fatal("the dead worker was never removed")
	}
	ags[0].await(t, "a world without the silent and the dead worker", func(x epoch.World) bool {
		return len(x.Members) == 2 && x.Rank(live) >= 0
	})
}
