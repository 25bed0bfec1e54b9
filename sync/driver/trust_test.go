package driver_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/membership"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/driver"
	"github.com/gorovod/gorovod/sync/epoch"
)

// driverNode is the driver as a member sees it.
func driverNode(t *testing.T, m *membership.Member) membership.Node {
	t.Helper()
	for _, n := range m.Members() {
		if n.Meta.Role == membership.RoleDriver {
			return n
		}
	}
	t.Fatal("no driver in view")
	return membership.Node{}
}

// sendRaw sends control bytes from member m to the driver, as a member that
// follows no protocol would.
func sendRaw(t *testing.T, ctx context.Context, m *membership.Member, b []byte) {
	t.Helper()
	if err := m.Send(ctx, driverNode(t, m), b); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// warned waits until the driver logged a warning containing every one of
// parts.
func warned(t *testing.T, log *records, parts ...string) {
	t.Helper()
	waitUntil(t, "a warning with "+strings.Join(parts, ", "), func() bool {
		return slices.ContainsFunc(log.warnings(), func(w string) bool {
			for _, p := range parts {
				if !strings.Contains(w, p) {
					return false
				}
			}
			return true
		})
	})
}

// TestControlPlaneAttacks: over real gossip, members of the job send the
// driver what a member that turned against the job would. Each message is
// refused with a warning that names its sender, and the job goes on: the
// next world has a sane number, no healthy worker is removed, and training
// is not over until a member of the current world says so.
func TestControlPlaneAttacks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	log := newRecords(t)
	d := startDriver(t, ctx, 2, slog.New(log))
	var ags []*agent
	for range 3 {
		ags = append(ags, startAgent(t, ctx, d.GossipAddr(), 2))
	}
	var w epoch.World
	for _, ag := range ags {
		w = ag.await(t, "all three are members", func(w epoch.World) bool { return len(w.Members) == 3 })
	}
	rogue, victim := ags[0], ags[1]
	boom := errors.New("boom")

	// A failure report numbered 2^64-1 used to set the next epoch to 0,
	// which every worker refuses: the job was wedged for good.
	sendRaw(t, ctx, rogue.m, control.EncodeFailure(math.MaxUint64, "", boom))
	warned(t, log, "dropped control message", rogue.name, "out of range")
	sendRaw(t, ctx, rogue.m, control.EncodeFailure(w.Number+epoch.MaxLead+1, "", boom))
	warned(t, log, "refused a control message", rogue.name, "out of range")
	victim.a.ReportFailure(w.Number, "", boom)
	for _, ag := range ags {
		next := ag.await(t, "the next world", func(x epoch.World) bool { return x.Number > w.Number })
		if next.Number != w.Number+1 || len(next.Members) != 3 {
			t.Fatalf("%s: after a genuine failure report of world %d the world is %d %v, want %d with all three",
				ag.name, w.Number, next.Number, names(next), w.Number+1)
		}
	}
	w = d.Current()

	// A flood of blame from one member: many reports per world, against
	// two healthy workers, world after world. Only its first report of each
	// world counts; the blamed worker answers its probe each time, and one
	// accuser alone never has it removed as stuck.
	for round := range 5 {
		for range 10 {
			sendRaw(t, ctx, rogue.m, control.EncodeFailure(w.Number, victim.name, boom))
			sendRaw(t, ctx, rogue.m, control.EncodeFailure(w.Number, ags[2].name, boom))
		}
		next := victim.await(t, "the world formed again", func(x epoch.World) bool { return x.Number > w.Number })
		if len(next.Members) != 3 {
			t.Fatalf("round %d: blame from one member shrank the world to %v", round, names(next))
		}
		w = next
	}

	// A worker that joins now is a member since this world: its report that
	// training ended in an earlier world is stale. A member of no world
	// cannot end training at all.
	late := startAgent(t, ctx, d.GossipAddr(), 2)
	four := late.await(t, "the newcomer admitted", func(x epoch.World) bool { return len(x.Members) == 4 })
	mc := gossipConfig()
	mc.Secret, mc.Seeds = []byte(secret), []string{d.GossipAddr()}
	outsider, err := membership.Join(ctx, mc, membership.Meta{JobID: jobID, Role: membership.RoleWorker})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outsider.Shutdown() })
	waitUntil(t, "the outsider in the driver's view", func() bool {
		return slices.ContainsFunc(d.Workers(), func(wi driver.WorkerInfo) bool { return wi.Name == outsider.Name() })
	})
	sendRaw(t, ctx, late.m, control.EncodeDone(four.Number-1))
	sendRaw(t, ctx, outsider, control.EncodeDone(four.Number))
	warned(t, log, "refused a control message", late.name, "done at")
	warned(t, log, "refused a control message", outsider.Name(), "done at")
	select {
	case <-d.Finished():
		t.Fatal("a stale report of the end of training ended the job")
	default:
	}
	if got := d.Current(); got.Number < four.Number || len(got.Members) != 4 {
		t.Fatalf("the job did not go on: world %d %v", got.Number, names(got))
	}
	// A member's report about the current world does end it.
	if err := late.a.Finish(ctx, d.Current().Number); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Finished():
	case <-ctx.Done():
		t.Fatal("a member's report of the end of training was not taken")
	}
}
