package epoch_test

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

func driverSeen(name string) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, Driver: true, State: epoch.Ready}}
}

// driverStarted is a driver in view that started at started (its
// StartedAt): of two, the newer is followed.
func driverStarted(name string, started int64) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, Driver: true, State: epoch.Ready, StartedAt: started}}
}

func epochMsg(w epoch.World) epoch.Message { return epoch.Message{Kind: epoch.MsgEpoch, World: w} }

func adopted(w epoch.World) epoch.Output { return epoch.Adopted{World: w} }

func send(to string, m epoch.Message) epoch.Output { return epoch.Send{To: to, Msg: m} }

// ack is a worker's acknowledgement of an epoch received: a pong without a
// nonce, carrying the newest epoch it knows.
func ack(to string, latest epoch.World) epoch.Output { return send(to, pong(0, latest)) }

// refused is the Refused output of m from from, its error wrapping want (the
// scripts compare outputs with reflect.DeepEqual; see sameOutputs).
func refused(from string, m epoch.Message, want error) epoch.Output {
	return epoch.Refused{From: from, Msg: m, Err: want}
}

func TestFollower(t *testing.T) {
	for _, tc := range []struct {
		name   string
		self   string
		script []step
	}{
		{name: "adopts only newer epochs: late, repeated and reordered announcements are old news", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, from("x", epochMsg(world(2, "a"))), outs(adopted(world(2, "a")), ack("x", world(2, "a")))},
			// Old news is acknowledged with the newest epoch the worker knows.
			{1 * ms, from("x", epochMsg(world(1, "a"))), outs(ack("x", world(2, "a")))},
			{2 * ms, from("x", epochMsg(world(2, "a"))), outs(ack("x", world(2, "a")))},
			{3 * ms, from("x", epochMsg(world(4, "a", "b"))), outs(adopted(world(4, "a", "b")), ack("x", world(4, "a", "b")))},
			{4 * ms, from("x", epochMsg(world(3, "a"))), outs(ack("x", world(4, "a", "b")))},
		}},
		{name: "answers a probe with the newest epoch it knows", self: "a", script: []step{
			{0, from("x", epoch.Message{Kind: epoch.MsgPing, Nonce: 7}), outs(send("x", pong(7, epoch.World{})))},
			{0, driverSeen("x"), nil},
			{1 * ms, from("x", epochMsg(world(3, "a"))), outs(adopted(world(3, "a")), ack("x", world(3, "a")))},
			{2 * ms, from("x", epoch.Message{Kind: epoch.MsgPing, Nonce: 8}), outs(send("x", pong(8, world(3, "a"))))},
		}},
		{name: "epochs out of range are refused, never adopted: the worker still takes the next sane one", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, from("x", epochMsg(world(2, "a"))), outs(adopted(world(2, "a")), ack("x", world(2, "a")))},
			{1 * ms, from("x", epochMsg(world(math.MaxUint64, "a"))),
				outs(refused("x", epochMsg(world(math.MaxUint64, "a")), epoch.ErrNumberOutOfRange))},
			{2 * ms, from("x", epochMsg(world(2+epoch.MaxLead+1, "a"))),
				outs(refused("x", epochMsg(world(2+epoch.MaxLead+1, "a")), epoch.ErrNumberOutOfRange))},
			{3 * ms, from("x", epochMsg(world(3, "a"))), outs(adopted(world(3, "a")), ack("x", world(3, "a")))},
		}},
		{name: "a worker that knows no epoch takes any number up to the maximum from its proposer", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, from("x", epochMsg(world(epoch.MaxNumber+1, "a"))),
				outs(refused("x", epochMsg(world(epoch.MaxNumber+1, "a")), epoch.ErrNumberOutOfRange))},
			{1 * ms, from("x", epochMsg(world(5*epoch.MaxLead, "a"))), outs(adopted(world(5*epoch.MaxLead, "a")), ack("x", world(5*epoch.MaxLead, "a")))},
		}},
		{name: "only a member that may propose announces epochs", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{0, ready("c"), nil},
			// c is in view but neither the driver nor a member of a world b knows.
			{1 * ms, from("c", epochMsg(world(2, "b", "c"))), outs(refused("c", epochMsg(world(2, "b", "c")), epoch.ErrNotProposer))},
			// Nor is a stranger.
			{1 * ms, from("m", epochMsg(world(2, "b"))), outs(refused("m", epochMsg(world(2, "b")), epoch.ErrNotProposer))},
			{2 * ms, from("x", epochMsg(world(2, "a", "b"))), outs(adopted(world(2, "a", "b")), ack("x", world(2, "a", "b")))},
			// a, a member of b's world, may have taken over.
			{3 * ms, from("a", epochMsg(world(3, "a", "b"))), outs(adopted(world(3, "a", "b")), ack("a", world(3, "a", "b")))},
		}},
		{name: "with two drivers in view, only the newest announces epochs and gets the reports", self: "a", script: []step{
			{0, driverStarted("old", 1), nil},
			{0, from("old", epochMsg(world(2, "a"))), outs(adopted(world(2, "a")), ack("old", world(2, "a")))},
			// A driver that took the job back while the old one was cut off.
			{1 * ms, driverStarted("new", 5), nil},
			{2 * ms, from("old", epochMsg(world(3, "a", "b"))), outs(refused("old", epochMsg(world(3, "a", "b")), epoch.ErrNotProposer))},
			{3 * ms, from("new", epochMsg(world(3, "a"))), outs(adopted(world(3, "a")), ack("new", world(3, "a")))},
			{4 * ms, epoch.ReportDone{Number: 3}, outs(send("new", done(3)))},
		}},
		{name: "reports go to the driver while one is in view", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{1 * ms, epoch.ReportDone{Number: 3}, outs(send("x", done(3)))},
		}},
		{name: "with no driver, reports go to the oldest ready worker", self: "b", script: []step{
			{0, joining("a"), nil}, // not ready: no candidate
			{0, ready("b"), nil},
			{0, ready("c"), nil},
			{1 * ms, epoch.ReportDone{Number: 3}, outs(epoch.Unroutable{Msg: done(3)})}, // b itself, not proposing yet
			{2 * ms, ready("a"), nil},
			{3 * ms, epoch.ReportDone{Number: 3}, outs(send("a", done(3)))},
		}},
		{name: "an end-of-training report while no proposer is in view is kept, and sent once the driver is back", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("b"), nil},
			// Gossip declares the driver dead (it was starved or frozen for a moment).
			{10 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{20 * ms, epoch.ReportDone{Number: 3}, outs(epoch.Unroutable{Msg: done(3)})},
			{1019 * ms, nil, nil},
			{1020 * ms, nil, nil}, // tried again: still nobody to take it (said once)
			{1500 * ms, driverSeen("x"), outs(send("x", done(3)))},
			{2600 * ms, nil, nil}, // handed over: not sent again
		}},
		{name: "an end-of-training report whose send failed is sent again a second later", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("b"), nil},
			{10 * ms, epoch.ReportDone{Number: 3}, outs(send("x", done(3)))},
			{20 * ms, epoch.SendFailed{To: "x", Msg: done(3)}, nil},
			{1019 * ms, nil, nil},
			{1020 * ms, nil, outs(send("x", done(3)))},
			{2100 * ms, nil, nil},
		}},
		{name: "a failure report is sent again every second until a newer epoch comes", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, from("x", epochMsg(world(2, "a", "b"))), outs(adopted(world(2, "a", "b")), ack("x", world(2, "a", "b")))},
			{10 * ms, epoch.ReportFailure{Number: 2, Blamed: "a", Cause: "boom"}, outs(send("x", failure(2, "a")))},
			{1009 * ms, nil, nil},
			{1010 * ms, nil, outs(send("x", failure(2, "a")))},
			{1500 * ms, from("x", epochMsg(world(3, "b"))), outs(adopted(world(3, "b")), ack("x", world(3, "b")))},
			{2010 * ms, nil, nil},
		}},
		{name: "the oldest ready worker takes over proposing once no driver has been seen for the grace", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{10 * ms, from("x", epochMsg(world(1, "a", "b"))), outs(adopted(world(1, "a", "b")), ack("x", world(1, "a", "b")))},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{2499 * ms, nil, nil},
			// The takeover first asks b which epoch it knows.
			{2500 * ms, nil, outs(send("b", epoch.Message{Kind: epoch.MsgPing, Nonce: 1}))},
			{2510 * ms, from("b", pong(1, world(2, "b"))), outs(epoch.TookOver{World: world(2, "b")})},
			// b knew a newer epoch (without a): the next one brings a back,
			// and a's own proposal is delivered to a at once.
			{2520 * ms, nil, outs(epoch.Proposed{World: world(3, "b", "a")}, adopted(world(3, "b", "a")),
				send("b", epochMsg(world(3, "b", "a"))))},
			// A report of its own goes to its own proposer.
			{2530 * ms, epoch.ReportDone{Number: 3}, outs(epoch.Finished{By: "a", Number: 3})},
			// The driver is back: a steps down.
			{3000 * ms, driverSeen("x"), outs(epoch.SteppedDown{})},
		}},
		{name: "cut off from the driver with a minority of its world, a worker waits for the network before it takes over", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{0, ready("c"), nil},
			{10 * ms, from("x", epochMsg(world(1, "a", "b", "c"))), outs(adopted(world(1, "a", "b", "c")), ack("x", world(1, "a", "b", "c")))},
			// A partition: a is alone on its side (1 of 3).
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{600 * ms, epoch.PeerGone{Name: "b", Failed: true}, nil},
			{700 * ms, epoch.PeerGone{Name: "c", Failed: true}, nil},
			{2500 * ms, nil, nil}, // the takeover grace is over: a majority would take over now
			{12499 * ms, nil, nil},
			// The others never came back: they are dead, and a goes on.
			{12500 * ms, nil, outs(epoch.TookOver{World: world(1, "a", "b", "c")})},
		}},
		{name: "a partition that heals within the minority grace leaves the driver proposing", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{0, ready("c"), nil},
			{10 * ms, from("x", epochMsg(world(1, "a", "b", "c"))), outs(adopted(world(1, "a", "b", "c")), ack("x", world(1, "a", "b", "c")))},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{600 * ms, epoch.PeerGone{Name: "b", Failed: true}, nil},
			{5000 * ms, driverSeen("x"), nil},
			{5000 * ms, ready("b"), nil},
			{20000 * ms, epoch.ReportDone{Number: 1}, outs(send("x", done(1)))},
		}},
		{name: "with a majority of its world in view, the oldest takes over after the grace alone", self: "a", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{0, ready("c"), nil},
			{10 * ms, from("x", epochMsg(world(1, "a", "b", "c"))), outs(adopted(world(1, "a", "b", "c")), ack("x", world(1, "a", "b", "c")))},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{600 * ms, epoch.PeerGone{Name: "c", Failed: true}, nil},
			{2499 * ms, nil, nil},
			{2500 * ms, nil, outs(send("b", epoch.Message{Kind: epoch.MsgPing, Nonce: 1}))},
		}},
		{name: "a worker that is not the oldest does not take over", self: "b", script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{0, ready("b"), nil},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{5000 * ms, nil, nil},
			// a is gone too: b is the oldest now, long after the driver.
			{6000 * ms, epoch.PeerGone{Name: "a", Failed: true}, outs(epoch.TookOver{})},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := epoch.NewFollower(epoch.FollowerConfig{Self: tc.self}, t0)
			runScript(t, f, tc.script)
		})
	}
}

// A worker that just joined waits out the grace before it may take over: its
// view may not show the driver yet.
func TestFollowerGraceFromStart(t *testing.T) {
	f := epoch.NewFollower(epoch.FollowerConfig{Self: "a"}, t0)
	if got := f.Step(t0.Add(10*ms), ready("a")); len(got) != 0 {
		t.Fatalf("got %s", show(got))
	}
	if d := f.Deadline(); !d.Equal(t0.Add(epoch.DefaultTakeoverGrace)) {
		t.Fatalf("deadline %v, want the end of the grace", d)
	}
	if f.Proposer() != nil {
		t.Fatal("proposing during the grace")
	}
	got := f.Tick(t0.Add(epoch.DefaultTakeoverGrace))
	// Alone: nobody to ask; it takes over at once, from nothing.
	if want := outs(epoch.TookOver{}); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s, want %s", show(got), show(want))
	}
	got = f.Tick(t0.Add(epoch.DefaultTakeoverGrace + 10*ms))
	if want := outs(epoch.Proposed{World: world(1, "a")}, adopted(world(1, "a"))); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s, want %s", show(got), show(want))
	}
	if f.Proposer() == nil || f.Latest().Number != 1 {
		t.Fatalf("proposer %v, latest %v", f.Proposer(), f.Latest())
	}
}

// TestFollowerDonePending: the end-of-training report counts as pending until
// it is handed to a proposer (the worker must not leave before, see
// driver.Agent.Finish).
func TestFollowerDonePending(t *testing.T) {
	f := epoch.NewFollower(epoch.FollowerConfig{Self: "b"}, t0)
	f.Step(t0, driverSeen("x"))
	f.Step(t0, ready("b"))
	f.Step(t0.Add(10*ms), epoch.PeerGone{Name: "x", Failed: true})
	if f.DonePending() {
		t.Fatal("pending before any report")
	}
	f.Step(t0.Add(20*ms), epoch.ReportDone{Number: 3})
	if !f.DonePending() {
		t.Fatal("not pending although no proposer was in view")
	}
	f.Step(t0.Add(30*ms), driverSeen("x"))
	if f.DonePending() {
		t.Fatal("still pending after it was sent to the driver")
	}
	f.Step(t0.Add(40*ms), epoch.SendFailed{To: "x", Msg: done(3)})
	if !f.DonePending() {
		t.Fatal("not pending again after its send failed")
	}
}

// TestFollowerTakeoverMinWorkers: during world formation no world exists, so
// the quorum check passes and a lone worker whose view lacks the driver for
// the takeover grace (a starved or frozen driver) proposes itself. With the
// job's minimum (gorovod run hands it to every worker as GOROVOD_MIN_WORKERS)
// it waits for that many ready workers instead of forming a world of one
// beside the driver's.
func TestFollowerTakeoverMinWorkers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		min    int
		script []step
	}{
		{name: "without the job's minimum a lone worker forms a world of one", min: 1, script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{2500 * ms, nil, outs(epoch.TookOver{})},
			{2510 * ms, nil, outs(epoch.Proposed{World: world(1, "a")}, adopted(world(1, "a")))},
		}},
		{name: "with the job's minimum of 3 it proposes nothing until 3 are ready", min: 3, script: []step{
			{0, driverSeen("x"), nil},
			{0, ready("a"), nil},
			{500 * ms, epoch.PeerGone{Name: "x", Failed: true}, nil},
			{2500 * ms, nil, outs(epoch.TookOver{})},
			{2510 * ms, nil, outs(epoch.Waiting{Have: 1, Min: 3})},
			{3000 * ms, ready("b"), nil},
			{3010 * ms, nil, outs(epoch.Waiting{Have: 2, Min: 3})},
			{3500 * ms, ready("c"), nil},
			{3510 * ms, nil, outs(epoch.Proposed{World: world(1, "a", "b", "c")}, adopted(world(1, "a", "b", "c")),
				sendEpoch(world(1, "a", "b", "c"), "b", "c"))},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := epoch.NewFollower(epoch.FollowerConfig{Self: "a", Proposer: epoch.ProposerConfig{MinWorkers: tc.min}}, t0)
			runScript(t, f, tc.script)
		})
	}
}

// TestFollowerFirstWorld: workers cut off from the driver as the job's first
// world forms (no world has reached them) and that see too few of the job's
// first workers (FirstWorld, gorovod run's --np) wait out the minority grace
// as well before one of them takes over, and then propose no world: the
// driver's side may be forming the first world without them.
func TestFollowerFirstWorld(t *testing.T) {
	grace := epoch.DefaultTakeoverGrace
	for _, tc := range []struct {
		name     string
		np       int
		ready    []string // besides a, in a's view
		takeover time.Duration
		proposed string // "" when no world is proposed
		noQuorum bool
	}{
		{name: "2 of 4: takes over after both graces, proposes nothing", np: 4, ready: []string{"b"},
			takeover: 500*ms + grace + epoch.DefaultMinorityGrace, noQuorum: true},
		{name: "3 of 4: takes over after the takeover grace and forms the first world", np: 4, ready: []string{"b", "c"},
			takeover: 500*ms + grace, proposed: "a b c"},
		{name: "the job's size not known: the pair forms a first world of its own", np: 0, ready: []string{"b"},
			takeover: 500*ms + grace, proposed: "a b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := epoch.NewFollower(epoch.FollowerConfig{Self: "a", Proposer: epoch.ProposerConfig{MinWorkers: 2, FirstWorld: tc.np}}, t0)
			f.Step(t0, driverSeen("x"))
			for _, n := range append([]string{"a"}, tc.ready...) {
				f.Step(t0, ready(n))
			}
			f.Step(t0.Add(500*ms), epoch.PeerGone{Name: "x", Failed: true})
			var tookAt time.Time
			var proposed []string
			noQuorum := false
			for now, end := t0.Add(500*ms), t0.Add(time.Minute); ; {
				d := f.Deadline()
				if d.IsZero() || d.After(end) {
					break
				}
				now = d
				outs := f.Tick(now)
				if f.Proposer() != nil && tookAt.IsZero() {
					tookAt = now
				}
				for _, o := range outs {
					switch o := o.(type) {
					case epoch.Proposed:
						proposed = append(proposed, names(o.World))
					case epoch.NoQuorum:
						noQuorum = noQuorum || o.Quorum.First
					}
				}
			}
			if want := t0.Add(tc.takeover); !tookAt.Equal(want) {
				t.Fatalf("took over at %v, want %v", tookAt.Sub(t0), tc.takeover)
			}
			var want []string
			if tc.proposed != "" {
				want = []string{tc.proposed}
			}
			if !slices.Equal(proposed, want) || noQuorum != tc.noQuorum {
				t.Fatalf("proposed %q (no first-world quorum said: %v), want %q (%v)", proposed, noQuorum, want, tc.noQuorum)
			}
		})
	}
}
