package driver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// A host that dies takes all its workers with it, but a failed collective
// blames one of them. The driver then looks whether the other workers in
// view still listen, and one whose gossip port refuses connections leaves
// the next world at once. Gossip's failure detection is slowed to an hour
// here, so nothing but that look can take out the worker nobody blamed.
func TestFailureSweepsWorkersWhoseProcessIsGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	blind := membership.DefaultConfig()
	blind.ProbeInterval, blind.ProbeTimeout = time.Hour, time.Second
	d, err := driver.Start(ctx, driver.Config{JobID: jobID, Secret: []byte(secret), MinWorkers: 1, Membership: blind})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var ms []*membership.Member
	var agents []*driver.Agent
	var worlds []chan epoch.World
	for range 4 {
		mc := blind
		mc.Secret, mc.Seeds = []byte(secret), []string{d.GossipAddr()}
		m, err := membership.Join(ctx, mc, membership.Meta{JobID: jobID, Role: membership.RoleWorker, CollectiveAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan epoch.World, 64)
		a := driver.StartAgent(m, driver.AgentConfig{OnAdopt: func(w epoch.World) { got <- w }})
		t.Cleanup(func() {
			_ = m.Shutdown()
			a.Stop()
		})
		if err := m.UpdateMeta(ctx, func(meta *membership.Meta) { meta.State = membership.StateReady }); err != nil {
			t.Fatal(err)
		}
		ms, worlds = append(ms, m), append(worlds, got)
		agents = append(agents, a)
	}
	await := func(what string, ok func(epoch.World) bool) epoch.World {
		t.Helper()
		for {
			select {
			case w := <-worlds[0]:
				if ok(w) {
					return w
				}
			case <-ctx.Done():
				t.Fatalf("no world where %s", what)
			}
		}
	}
	w := await("all four are members", func(w epoch.World) bool { return len(w.Members) == 4 })
	// "Host" of workers 2 and 3 dies: their processes are gone, no goodbye.
	for _, m := range ms[2:] {
		_ = m.Shutdown()
	}
	start := time.Now()
	agents[0].ReportFailure(w.Number, ms[2].Name(), fmt.Errorf("peer closed the connection"))
	two := await("both dead workers gone", func(x epoch.World) bool {
		return x.Number > w.Number && x.Rank(ms[2].Name()) < 0 && x.Rank(ms[3].Name()) < 0
	})
	t.Logf("a world without both dead workers (epoch %d, %d members) %v after the report", two.Number, len(two.Members), time.Since(start))
	if two.Rank(ms[0].Name()) < 0 || two.Rank(ms[1].Name()) < 0 {
		t.Fatalf("a live worker was left out: %v", two)
	}
}
