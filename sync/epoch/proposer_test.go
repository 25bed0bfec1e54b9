package epoch_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/epoch"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one line of a machine's script: at a time, an input (or, with nil,
// a Tick) and exactly the outputs it must return, in order.
type step struct {
	at   time.Duration
	in   epoch.Input
	want []epoch.Output
}

func runScript(t *testing.T, m interface {
	Step(time.Time, epoch.Input) []epoch.Output
	Tick(time.Time) []epoch.Output
}, script []step) {
	t.Helper()
	for i, s := range script {
		now := t0.Add(s.at)
		var got []epoch.Output
		what := "tick"
		if s.in == nil {
			got = m.Tick(now)
		} else {
			got = m.Step(now, s.in)
			what = fmt.Sprintf("%T%+v", s.in, s.in)
		}
		if !sameOutputs(got, s.want) {
			t.Fatalf("step %d (%v, %s):\n got %s\nwant %s", i, s.at, what, show(got), show(s.want))
		}
	}
}

// sameOutputs compares outputs as reflect.DeepEqual does, except that a
// wanted Refused's Err matches a got one it wraps (errors.Is).
func sameOutputs(got, want []epoch.Output) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, gok := got[i].(epoch.Refused)
		w, wok := want[i].(epoch.Refused)
		if gok && wok {
			if g.From != w.From || !reflect.DeepEqual(g.Msg, w.Msg) || !errors.Is(g.Err, w.Err) {
				return false
			}
			continue
		}
		if !reflect.DeepEqual(got[i], want[i]) {
			return false
		}
	}
	return true
}

func show(outs []epoch.Output) string {
	if len(outs) == 0 {
		return "nothing"
	}
	var b strings.Builder
	for _, o := range outs {
		switch o := o.(type) {
		case epoch.Send:
			fmt.Fprintf(&b, "\n\tSend to %s: %s", o.To, o.Msg)
		default:
			fmt.Fprintf(&b, "\n\t%T%+v", o, o)
		}
	}
	return b.String()
}

// Helpers that make scripts read like the protocol.
func member(name string) epoch.Member { return epoch.Member{Name: name, Addr: name + ":1"} }

func world(n uint64, names ...string) epoch.World {
	w := epoch.World{Number: n}
	for _, name := range names {
		w.Members = append(w.Members, member(name))
	}
	return w
}

func ready(name string) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, State: epoch.Ready, Addr: name + ":1", StartedAt: int64(name[len(name)-1])}}
}

func joining(name string) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, State: epoch.Joining, Addr: name + ":1", StartedAt: int64(name[len(name)-1])}}
}

func leaving(name string) epoch.Input {
	return epoch.PeerSeen{Peer: epoch.Peer{Name: name, State: epoch.Leaving, Addr: name + ":1", StartedAt: int64(name[len(name)-1])}}
}

func from(name string, m epoch.Message) epoch.Input { return epoch.Received{From: name, Msg: m} }

func failure(n uint64, blamed string) epoch.Message {
	return epoch.Message{Kind: epoch.MsgFailure, Number: n, Blamed: blamed, Cause: "boom"}
}

func done(n uint64) epoch.Message { return epoch.Message{Kind: epoch.MsgDone, Number: n} }

func pong(nonce uint64, w epoch.World) epoch.Message {
	return epoch.Message{Kind: epoch.MsgPong, Nonce: nonce, World: w}
}

func sendEpoch(w epoch.World, to ...string) []epoch.Output {
	var out []epoch.Output
	for _, name := range to {
		out = append(out, epoch.Send{To: name, Msg: epoch.Message{Kind: epoch.MsgEpoch, World: w}})
	}
	return out
}

// outForGood is the epoch sent to a worker it leaves out for good.
func outForGood(w epoch.World, to string) epoch.Output {
	return epoch.Send{To: to, Msg: epoch.Message{Kind: epoch.MsgEpoch, World: w, Final: true}}
}

func ping(to string, nonce uint64) epoch.Output {
	return epoch.Send{To: to, Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: nonce}}
}

func propose(w epoch.World, to ...string) []epoch.Output {
	return append([]epoch.Output{epoch.Proposed{World: w}}, sendEpoch(w, to...)...)
}

func outs(groups ...any) []epoch.Output {
	var out []epoch.Output
	for _, g := range groups {
		switch g := g.(type) {
		case epoch.Output:
			out = append(out, g)
		case []epoch.Output:
			out = append(out, g...)
		}
	}
	return out
}

const ms = time.Millisecond

// twoWorkers is the start of many scripts: a and b ready, epoch 1 proposed
// after the coalescing wait (10 ms by default).
var twoWorkers = []step{
	{0, ready("a"), nil},
	{1 * ms, ready("b"), nil},
	{11 * ms, nil, propose(world(1, "a", "b"), "a", "b")},
}

func script(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestProposer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    epoch.ProposerConfig
		script []step
	}{
		{name: "changes closer together than Coalesce make one epoch", script: []step{
			{0, ready("a"), nil},
			{5 * ms, ready("b"), nil},
			{10 * ms, nil, nil}, // the wait restarted at the second change
			{14 * ms, ready("c"), nil},
			{20 * ms, nil, nil},
			{24 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
			{30 * ms, nil, nil},
		}},
		{name: "no world below MinWorkers: the job waits", cfg: epoch.ProposerConfig{MinWorkers: 2}, script: []step{
			{0, ready("a"), nil},
			{10 * ms, nil, outs(epoch.Waiting{Have: 1, Min: 2})},
			{20 * ms, nil, nil}, // nothing until the next change
			{500 * ms, joining("b"), nil},
			{600 * ms, ready("b"), nil},
			{610 * ms, nil, propose(world(1, "a", "b"), "a", "b")},
		}},
		{name: "a joiner is told where the job stands, then appended", script: script(twoWorkers, []step{
			{20 * ms, joining("c"), nil},
			{30 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{40 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")},
		})},
		{name: "survivors keep their order: rank 0 is the oldest survivor", script: script(twoWorkers, []step{
			{20 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{30 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")},
			{40 * ms, epoch.PeerGone{Name: "a", Failed: true}, outs(ping("a", 1))},
			{41 * ms, epoch.SendFailed{To: "a", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}}, outs(epoch.Removed{Name: "a", Why: epoch.ReasonFailed})},
			{51 * ms, nil, propose(world(3, "b", "c"), "b", "c")},
		})},
		{name: "a leaving worker is told the epoch without it; a gone one is not", script: script(twoWorkers, []step{
			{20 * ms, leaving("b"), outs(epoch.Removed{Name: "b", Why: epoch.ReasonLeaving})},
			{30 * ms, nil, propose(world(2, "a"), "a", "b")},
			{40 * ms, epoch.PeerGone{Name: "b"}, nil},
			{1030 * ms, nil, sendEpoch(world(2, "a"), "a")}, // the re-announcement
		})},
		{name: "the current epoch goes to every worker in view every Reannounce", script: script(twoWorkers, []step{
			{500 * ms, joining("c"), nil},
			{1010 * ms, nil, nil},
			{1011 * ms, nil, sendEpoch(world(1, "a", "b"), "a", "b", "c")},
			{2011 * ms, nil, sendEpoch(world(1, "a", "b"), "a", "b", "c")},
		})},
		{name: "a blamed worker that answers its probe stays; the failed world is formed again", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{30 * ms, nil, nil}, // the proposal waits for the probe
			{40 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
		})},
		{name: "a worker blamed for three worlds in a row that answers every probe is stuck: removed, and not admitted again under its name", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{40 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
			{50 * ms, from("a", failure(2, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 2, Cause: "boom"}, ping("b", 2))},
			{60 * ms, from("b", pong(2, world(2, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{60 * ms, nil, propose(world(3, "a", "b"), "a", "b")},
			// The third: no probe, b is out (its gossip answers, its training does not).
			{70 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, epoch.Removed{Name: "b", Why: epoch.ReasonStuck})},
			{80 * ms, nil, propose(world(4, "a"), "a", "b")},
			{90 * ms, ready("b"), nil},
			{200 * ms, nil, nil},
		})},
		{name: "blames far apart do not add up", cfg: epoch.ProposerConfig{BlameWindow: time.Second}, script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{40 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
			{50 * ms, from("a", failure(2, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 2, Cause: "boom"}, ping("b", 2))},
			{60 * ms, from("b", pong(2, world(2, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{60 * ms, nil, propose(world(3, "a", "b"), "a", "b")},
			{1070 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, ping("b", 3))},
		})},
		{name: "a stuck worker is not removed below the minimum", cfg: epoch.ProposerConfig{MinWorkers: 2}, script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{40 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
			{50 * ms, from("a", failure(2, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 2, Cause: "boom"}, ping("b", 2))},
			{60 * ms, from("b", pong(2, world(2, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{60 * ms, nil, propose(world(3, "a", "b"), "a", "b")},
			{70 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, ping("b", 3))},
		})},
		{name: "a blamed worker that does not answer is removed", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{187 * ms, nil, outs(ping("b", 1))}, // pings go out three times in ProbeTimeout
			{354 * ms, nil, outs(ping("b", 1))},
			{520 * ms, nil, outs(epoch.Removed{Name: "b", Why: epoch.ReasonUnanswered})},
			{530 * ms, nil, propose(world(2, "a"), "a", "b")},
		})},
		{name: "a blamed worker that cannot be reached is removed at once", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{21 * ms, epoch.SendFailed{To: "b", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}},
				outs(epoch.Removed{Name: "b", Why: epoch.ReasonUnanswered})},
			{31 * ms, nil, propose(world(2, "a"), "a", "b")},
		})},
		{name: "a late answer puts a removed suspect back before the next epoch", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{21 * ms, epoch.SendFailed{To: "b", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}},
				outs(epoch.Removed{Name: "b", Why: epoch.ReasonUnanswered})},
			{25 * ms, from("b", failure(1, "a")), outs(epoch.Cleared{Name: "b"},
				epoch.Suspected{Name: "a", By: "b", Number: 1, Cause: "boom"}, ping("a", 2))},
			{30 * ms, from("a", pong(2, world(1, "a", "b"))), outs(epoch.Cleared{Name: "a"})},
			{40 * ms, nil, propose(world(2, "a", "b"), "a", "b")},
		})},
		{name: "a suspect still ready after the cool-down was waiting to join: it is admitted again", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1))},
			{21 * ms, epoch.SendFailed{To: "b", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}},
				outs(epoch.Removed{Name: "b", Why: epoch.ReasonUnanswered})},
			{31 * ms, nil, propose(world(2, "a"), "a", "b")},
			{1031 * ms, nil, sendEpoch(world(2, "a"), "a", "b")},
			{2021 * ms, nil, outs(epoch.Cleared{Name: "b"})},
			{2031 * ms, nil, propose(world(3, "a", "b"), "a", "b")},
		})},
		{name: "a report about a replaced world changes nothing", script: script(twoWorkers, []step{
			{20 * ms, leaving("b"), outs(epoch.Removed{Name: "b", Why: epoch.ReasonLeaving})},
			{30 * ms, nil, propose(world(2, "a"), "a", "b")},
			{40 * ms, from("a", failure(1, "b")), nil},
			{50 * ms, nil, nil},
		})},
		{name: "an evicted worker is never admitted again", script: script(twoWorkers, []step{
			{20 * ms, epoch.Evict{Name: "b"}, outs(epoch.Removed{Name: "b", Why: epoch.ReasonEvicted})},
			{30 * ms, nil, outs(propose(world(2, "a"), "a"), outForGood(world(2, "a"), "b"))},
			{40 * ms, ready("b"), nil},
			{50 * ms, nil, nil},
		})},
		{name: "a ready worker without a collective address is ignored", script: []step{
			{0, epoch.PeerSeen{Peer: epoch.Peer{Name: "a", State: epoch.Ready}}, outs(epoch.Ignored{Name: "a", Why: "ready without a collective address"})},
			{10 * ms, nil, nil},
		}},
		{name: "the driver and joining workers are no candidates", script: []step{
			{0, epoch.PeerSeen{Peer: epoch.Peer{Name: "driver", Driver: true, State: epoch.Ready}}, nil},
			{0, joining("a"), nil},
			{10 * ms, nil, nil},
		}},
		{name: "once training is over, departures and arrivals change nothing, and departing workers are not told",
			cfg: epoch.ProposerConfig{MinWorkers: 2}, script: script(twoWorkers, []step{
				{20 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
				{30 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")},
				{40 * ms, from("a", done(2)), outs(epoch.Finished{By: "a", Number: 2})},
				{41 * ms, leaving("a"), nil},
				{42 * ms, epoch.PeerGone{Name: "a"}, nil},
				{43 * ms, ready("d"), nil},
				{44 * ms, leaving("b"), nil},
				{60 * ms, nil, nil},
				{1030 * ms, nil, outs(sendEpoch(world(2, "a", "b", "c"), "c"), outForGood(world(2, "a", "b", "c"), "d"))},
			})},
		{name: "rescue: members whose last step failed get a world without the finished ones, however small",
			cfg: epoch.ProposerConfig{MinWorkers: 3}, script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
				// (b is probed too: the census of a failed world.)
				{20 * ms, from("c", failure(1, "a")), outs(epoch.Suspected{Name: "a", By: "c", Number: 1, Cause: "boom"}, ping("a", 1), ping("b", 2))},
				{21 * ms, from("a", done(1)), outs(epoch.Cleared{Name: "a"}, epoch.Finished{By: "a", Number: 1},
					epoch.Rescued{Number: 1, Finished: []string{"a"}}, epoch.Removed{Name: "a", Why: epoch.ReasonFinished})},
				{22 * ms, from("b", done(1)), outs(epoch.Finished{By: "b", Number: 1},
					epoch.Rescued{Number: 1, Finished: []string{"a", "b"}}, epoch.Removed{Name: "b", Why: epoch.ReasonFinished})},
				{30 * ms, from("a", pong(1, world(1, "a", "b", "c"))), nil},
				{40 * ms, nil, propose(world(2, "c"), "c")},
				{50 * ms, from("c", done(2)), outs(epoch.Finished{By: "c", Number: 2})},
			}},
		{name: "rescue: a member whose end is reported after the rescue's world was proposed is left out of it too",
			cfg: epoch.ProposerConfig{MinWorkers: 3}, script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
				{20 * ms, from("b", done(1)), outs(epoch.Finished{By: "b", Number: 1})},
				{21 * ms, from("c", failure(1, "b")), outs(epoch.Rescued{Number: 1, Finished: []string{"b"}},
					epoch.Removed{Name: "b", Why: epoch.ReasonFinished}, epoch.Suspected{Name: "b", By: "c", Number: 1, Cause: "boom"},
					ping("b", 1))},
				{25 * ms, from("b", pong(1, world(1, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
				{40 * ms, nil, propose(world(2, "a", "c"), "a", "c")},
				// a finished the last step in world 1 too; its report comes
				// now, while c waits in world 2 for a link to a.
				{41 * ms, from("a", done(1)), outs(epoch.Finished{By: "a", Number: 1},
					epoch.Rescued{Number: 2, Finished: []string{"a"}}, epoch.Removed{Name: "a", Why: epoch.ReasonFinished})},
				{60 * ms, nil, propose(world(3, "c"), "c")},
				{70 * ms, from("c", done(3)), outs(epoch.Finished{By: "c", Number: 3})},
			}},
		{name: "a member declared dead that is back before a world without it keeps its place: no new world",
			cfg: epoch.ProposerConfig{MinWorkers: 3}, script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
				// Gossip flaps under load: b is declared dead, does not
				// answer its probe in time (a starved process), then refutes.
				{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
				{187 * ms, nil, outs(ping("b", 1))},
				{354 * ms, nil, outs(ping("b", 1))},
				{520 * ms, nil, outs(epoch.Removed{Name: "b", Why: epoch.ReasonFailed})},
				{530 * ms, nil, outs(epoch.Waiting{Have: 2, Min: 3})},
				{540 * ms, ready("b"), sendEpoch(world(1, "a", "b", "c"), "b")},
				{550 * ms, nil, nil}, // [a b c] again, not [a c b]
				{1010 * ms, nil, sendEpoch(world(1, "a", "b", "c"), "a", "b", "c")},
			}},
		{name: "a member declared dead that is back after a world without it is appended", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "a", Failed: true}, outs(ping("a", 1))},
			{21 * ms, epoch.SendFailed{To: "a", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}}, outs(epoch.Removed{Name: "a", Why: epoch.ReasonFailed})},
			{31 * ms, nil, propose(world(2, "b"), "b")},
			{40 * ms, ready("a"), sendEpoch(world(2, "b"), "a")},
			{50 * ms, nil, propose(world(3, "b", "a"), "a", "b")},
		})},
		// Gossip's verdict is a suspicion, probed like a blame: under load a
		// live worker starved of CPU misses gossip's probes.
		{name: "a member gossip declared dead that answers its probe stays: no new world", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{30 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{40 * ms, nil, nil}, // the proposal waits for the probe
			{100 * ms, from("b", pong(1, world(1, "a", "b"))), outs(epoch.Cleared{Name: "b"})},
			{100 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")}, // b in view again: told
			// Gossip's own "alive" changes nothing; a second verdict is
			// probed again, and answered again.
			{200 * ms, ready("b"), sendEpoch(world(2, "a", "b", "c"), "b")},
			{210 * ms, nil, nil},
			{300 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 2))},
			{310 * ms, from("b", pong(2, world(2, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
			{320 * ms, nil, nil},
		})},
		{name: "a member gossip declared dead whose gossip refutes before its pong stays", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{60 * ms, ready("b"), outs(epoch.Cleared{Name: "b"}, sendEpoch(world(1, "a", "b"), "b"))},
			{70 * ms, nil, nil},
			{80 * ms, from("b", pong(1, world(1, "a", "b"))), nil}, // the late pong: not news
			{90 * ms, nil, nil},
		})},
		{name: "a member gossip declared dead that does not answer is removed after ProbeTimeout", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{187 * ms, nil, outs(ping("b", 1))},
			{354 * ms, nil, outs(ping("b", 1))},
			{519 * ms, nil, nil},
			{520 * ms, nil, outs(epoch.Removed{Name: "b", Why: epoch.ReasonFailed})},
			{530 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "a member gossip declared dead whose ping cannot be sent is removed at once", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{20 * ms, epoch.SendFailed{To: "b", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 1}}, outs(epoch.Removed{Name: "b", Why: epoch.ReasonFailed})},
			{30 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "a member gossip declared dead and blamed is removed as unanswered", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{25 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"})},
			{520 * ms, nil, outs(epoch.Removed{Name: "b", Why: epoch.ReasonUnanswered})},
			{530 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "a member whose process exited is removed at once without a probe", script: script(twoWorkers, []step{
			{20 * ms, epoch.Exited{Name: "b"}, outs(epoch.Removed{Name: "b", Why: epoch.ReasonFailed})},
			{30 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "a member that leaves gracefully is removed at once without a probe", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b"}, outs(epoch.Removed{Name: "b", Why: epoch.ReasonLeft})},
			{30 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "the process of a member gossip declared dead exits during its probe: removed at once", script: script(twoWorkers, []step{
			{20 * ms, epoch.PeerGone{Name: "b", Failed: true}, outs(ping("b", 1))},
			{30 * ms, epoch.Exited{Name: "b"}, outs(epoch.Removed{Name: "b", Why: epoch.ReasonFailed})},
			{40 * ms, nil, propose(world(2, "a"), "a")},
		})},
		{name: "a report of a newer epoch than its own (another proposer's) numbers the next one above it", script: script(twoWorkers, []step{
			{20 * ms, from("a", failure(5, "")), nil},
			{30 * ms, nil, propose(world(6, "a", "b"), "a", "b")},
		})},
		{name: "a newer world another proposer announced is taken over", script: script(twoWorkers, []step{
			{20 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{21 * ms, from("x", epoch.Message{Kind: epoch.MsgEpoch, World: world(4, "b", "a")}), nil},
			{31 * ms, nil, propose(world(5, "b", "a", "c"), "a", "b", "c")},
		})},
		{name: "a new epoch is sent again to the workers that have not acknowledged it, after Resend, then twice as long, up to Reannounce",
			cfg: epoch.ProposerConfig{Resend: 25 * ms, Reannounce: 200 * ms}, script: []step{
				{0, ready("a"), nil},
				{0, ready("b"), nil},
				{0, ready("c"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
				{12 * ms, from("a", pong(0, world(1, "a", "b", "c"))), nil}, // acknowledged
				{34 * ms, nil, nil},
				{35 * ms, nil, sendEpoch(world(1, "a", "b", "c"), "b", "c")},
				{36 * ms, from("b", pong(0, world(1, "a", "b", "c"))), nil},
				{85 * ms, nil, sendEpoch(world(1, "a", "b", "c"), "c")},
				{185 * ms, nil, sendEpoch(world(1, "a", "b", "c"), "c")},
				{385 * ms, nil, sendEpoch(world(1, "a", "b", "c"), "c")}, // capped at Reannounce
				{390 * ms, from("c", pong(0, world(1, "a", "b", "c"))), nil},
				{585 * ms, nil, nil}, // every worker has it: nothing is sent
				// A new epoch starts the fast re-sends again: after twice the
				// time half the workers took to acknowledge the last one (b,
				// the second of three, after 26 ms), as that is more than Resend.
				{600 * ms, leaving("c"), outs(epoch.Removed{Name: "c", Why: epoch.ReasonLeaving})},
				{610 * ms, nil, propose(world(2, "a", "b"), "a", "b", "c")},
				{611 * ms, from("a", pong(0, world(2, "a", "b"))), nil},
				{611 * ms, from("c", pong(0, world(2, "a", "b"))), nil},
				{635 * ms, nil, nil},
				{662 * ms, nil, sendEpoch(world(2, "a", "b"), "b")},
				// Those acknowledged within 1 ms: the next epoch is re-sent after Resend.
				{700 * ms, from("b", pong(0, world(2, "a", "b"))), nil},
				{800 * ms, ready("d"), sendEpoch(world(2, "a", "b"), "d")},
				{810 * ms, nil, propose(world(3, "a", "b", "d"), "a", "b", "c", "d")},
				{835 * ms, nil, sendEpoch(world(3, "a", "b", "d"), "a", "b", "c", "d")},
			}},
		{name: "on a loaded machine, where workers take 60 ms to acknowledge an epoch, the next one is not sent again before they could have",
			cfg: epoch.ProposerConfig{Resend: 25 * ms, Reannounce: time.Second}, script: []step{
				{0, ready("a"), nil},
				{0, ready("b"), nil},
				{0, ready("c"), nil},
				{0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				{35 * ms, nil, sendEpoch(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")}, // nothing known yet: after Resend
				{50 * ms, from("a", pong(0, world(1, "a", "b", "c", "d"))), nil},
				{70 * ms, from("b", pong(0, world(1, "a", "b", "c", "d"))), nil}, // half of them after 60 ms
				{75 * ms, from("c", pong(0, world(1, "a", "b", "c", "d"))), nil},
				{80 * ms, from("d", pong(0, world(1, "a", "b", "c", "d"))), nil},
				{100 * ms, leaving("d"), outs(epoch.Removed{Name: "d", Why: epoch.ReasonLeaving})},
				{110 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c", "d")},
				{135 * ms, nil, nil}, // not after Resend: each copy is on its way
				{175 * ms, from("a", pong(0, world(2, "a", "b", "c"))), nil},
				{180 * ms, from("b", pong(0, world(2, "a", "b", "c"))), nil},
				{180 * ms, from("d", pong(0, world(2, "a", "b", "c"))), nil},
				{229 * ms, nil, nil},
				{230 * ms, nil, sendEpoch(world(2, "a", "b", "c"), "c")}, // twice 60 ms after the proposal
			}},
		{name: "a failed world is formed again only after every member answered a probe (the census): a dead member not blamed is found at once",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil}, {0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				// d crashed; a blames its neighbour b, which aborted.
				{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"},
					ping("b", 1), ping("c", 2), ping("d", 3))},
				{21 * ms, from("b", pong(1, world(1, "a", "b", "c", "d"))), outs(epoch.Cleared{Name: "b"})},
				{21 * ms, from("c", pong(2, world(1, "a", "b", "c", "d"))), nil}, // not a suspect: nothing to clear
				{22 * ms, epoch.SendFailed{To: "d", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 3}}, outs(epoch.Removed{Name: "d", Why: epoch.ReasonUnanswered})},
				{32 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c", "d")},
				// More reports about world 1 change nothing; the census is once per world.
				{33 * ms, from("c", failure(1, "b")), nil},
			}},
		{name: "a worker that answered a probe about the failed world is not probed again when blamed for it again: the next world is not held back",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c"), "a", "b", "c")},
				{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1), ping("c", 2))},
				{21 * ms, from("b", pong(1, world(1, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
				{21 * ms, from("c", pong(2, world(1, "a", "b", "c"))), nil},
				{25 * ms, from("c", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "c", Number: 1, Cause: "boom"})}, // no ping
				{30 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c")},
			}},
		{name: "a death explains the failure of its world: the live members blamed for it were not stuck",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil}, {0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				// d died; a blames b, which aborted; the census finds d.
				{20 * ms, from("a", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 1, Cause: "boom"}, ping("b", 1), ping("c", 2), ping("d", 3))},
				{21 * ms, from("b", pong(1, world(1, "a", "b", "c", "d"))), outs(epoch.Cleared{Name: "b"})},
				{21 * ms, from("c", pong(2, world(1, "a", "b", "c", "d"))), nil},
				{22 * ms, epoch.SendFailed{To: "d", Msg: epoch.Message{Kind: epoch.MsgPing, Nonce: 3}}, outs(epoch.Removed{Name: "d", Why: epoch.ReasonUnanswered})},
				{32 * ms, nil, propose(world(2, "a", "b", "c"), "a", "b", "c", "d")},
				{40 * ms, from("c", failure(2, "b")), outs(epoch.Suspected{Name: "b", By: "c", Number: 2, Cause: "boom"}, ping("b", 4), ping("a", 5))},
				{41 * ms, from("b", pong(4, world(2, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
				{41 * ms, from("a", pong(5, world(2, "a", "b", "c"))), nil},
				{51 * ms, nil, propose(world(3, "a", "b", "c"), "a", "b", "c", "d")},
				// Blamed by two members for three worlds in a row, but the first
				// one's failure was d's death: b is probed, not removed.
				{60 * ms, from("a", failure(3, "b")), outs(epoch.Suspected{Name: "b", By: "a", Number: 3, Cause: "boom"}, ping("b", 6), ping("c", 7))},
			}},
		{name: "a world a member of which the launcher lost is formed again without a census, and the lost member blamed is not probed",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil}, {0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				// d's host died; the launcher lost it; a blames d, c blames b.
				{20 * ms, epoch.Evict{Name: "d", Lost: true}, outs(epoch.Removed{Name: "d", Why: epoch.ReasonEvicted})},
				{21 * ms, from("a", failure(1, "d")), outs(epoch.Suspected{Name: "d", By: "a", Number: 1, Cause: "boom"})},
				// A live member blamed is still probed, and the world waits for it.
				{22 * ms, from("c", failure(1, "b")), outs(epoch.Suspected{Name: "b", By: "c", Number: 1, Cause: "boom"}, ping("b", 1))},
				{30 * ms, nil, nil},
				{31 * ms, from("b", pong(1, world(1, "a", "b", "c", "d"))), outs(epoch.Cleared{Name: "b"})},
				{31 * ms, nil, outs(propose(world(2, "a", "b", "c"), "a", "b", "c"), outForGood(world(2, "a", "b", "c"), "d"))},
			}},
		{name: "a census taken before the launcher lost a member does not hold the next world",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil}, {0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				{20 * ms, from("a", failure(1, "")), outs(ping("b", 1), ping("c", 2), ping("d", 3))},
				{21 * ms, epoch.Evict{Name: "d", Lost: true}, outs(epoch.Removed{Name: "d", Why: epoch.ReasonEvicted})},
				{31 * ms, nil, outs(propose(world(2, "a", "b", "c"), "a", "b", "c"), outForGood(world(2, "a", "b", "c"), "d"))},
			}},
		{name: "a scale-down is no explanation: a failure of its world has every member probed",
			script: []step{
				{0, ready("a"), nil}, {0, ready("b"), nil}, {0, ready("c"), nil}, {0, ready("d"), nil},
				{10 * ms, nil, propose(world(1, "a", "b", "c", "d"), "a", "b", "c", "d")},
				{20 * ms, epoch.Evict{Name: "d"}, outs(epoch.Removed{Name: "d", Why: epoch.ReasonEvicted})},
				{21 * ms, from("a", failure(1, "")), outs(ping("b", 1), ping("c", 2))},
				{30 * ms, nil, nil},
				{31 * ms, from("b", pong(1, world(1, "a", "b", "c", "d"))), nil},
				{31 * ms, nil, nil},
				{32 * ms, from("c", pong(2, world(1, "a", "b", "c", "d"))), nil},
				{32 * ms, nil, outs(propose(world(2, "a", "b", "c"), "a", "b", "c"), outForGood(world(2, "a", "b", "c"), "d"))},
			}},
		{name: "SetMinWorkers holds proposals back", script: script(twoWorkers, []step{
			{20 * ms, epoch.SetMinWorkers{N: 3}, nil},
			{30 * ms, nil, outs(epoch.Waiting{Have: 2, Min: 3})},
			{40 * ms, leaving("b"), outs(epoch.Removed{Name: "b", Why: epoch.ReasonLeaving})},
			{50 * ms, nil, outs(epoch.Waiting{Have: 1, Min: 3})},
			{60 * ms, ready("c"), sendEpoch(world(1, "a", "b"), "c")},
			{70 * ms, nil, outs(epoch.Waiting{Have: 2, Min: 3})},
			{80 * ms, ready("d"), sendEpoch(world(1, "a", "b"), "d")},
			{90 * ms, nil, propose(world(2, "a", "c", "d"), "a", "b", "c", "d")},
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Resend == 0 {
				// These scripts feed no acknowledgements: a new epoch is
				// re-sent only with the re-announcement, as the cases about
				// the fast re-send below show.
				cfg.Resend = epoch.DefaultProposerConfig().Reannounce
			}
			runScript(t, epoch.NewProposer(cfg), tc.script)
		})
	}
}

// A proposer taking over asks the workers which epoch they know and continues
// from the newest: the previous proposer's last epoch may have reached only
// some of them.
func TestResume(t *testing.T) {
	view := []epoch.Peer{
		{Name: "a", State: epoch.Ready, Addr: "a:1", StartedAt: 1},
		{Name: "b", State: epoch.Ready, Addr: "b:1", StartedAt: 2},
		{Name: "c", State: epoch.Ready, Addr: "c:1", StartedAt: 3},
		{Name: "d", State: epoch.Ready, Addr: "d:1", StartedAt: 4},
		{Name: "x", Driver: true, State: epoch.Ready},
	}
	cfg := epoch.ProposerConfig{Self: "a"}
	t.Run("continues from the newest epoch a worker knows", func(t *testing.T) {
		p, first := epoch.Resume(cfg, t0, world(3, "a", "b", "c"), view)
		if want := outs(ping("b", 1), ping("c", 2), ping("d", 3)); !reflect.DeepEqual(first, want) {
			t.Fatalf("start: got %s, want %s", show(first), show(want))
		}
		runScript(t, p, []step{
			{5 * ms, from("c", pong(2, world(3, "a", "b", "c"))), nil},
			{6 * ms, from("b", pong(1, world(4, "a", "b"))), nil}, // only b got the last epoch
			{20 * ms, nil, nil}, // nothing is proposed while d has not answered
			{30 * ms, from("d", pong(3, epoch.World{})), outs(epoch.TookOver{World: world(4, "a", "b"), Unheard: nil})},
			{40 * ms, nil, propose(world(5, "a", "b", "c", "d"), "a", "b", "c", "d")},
		})
	})
	t.Run("workers that do not answer are asked again, until the deadline", func(t *testing.T) {
		p, _ := epoch.Resume(cfg, t0, world(3, "a", "b", "c", "d"), view)
		runScript(t, p, []step{
			{1 * ms, from("b", pong(1, world(3, "a", "b", "c", "d"))), nil},
			{2 * ms, epoch.PeerGone{Name: "c", Failed: true}, nil}, // gone: not waited for
			{167 * ms, nil, outs(ping("d", 3))},
			{334 * ms, nil, outs(ping("d", 3))},
			{500 * ms, nil, outs(ping("d", 4))}, // a new probe
			{2000 * ms, nil, outs(epoch.TookOver{World: world(3, "a", "b", "c", "d"), Unheard: []string{"d"}})},
			{2010 * ms, nil, propose(world(4, "a", "b", "d"), "a", "b", "d")},
		})
	})
	t.Run("reports that arrive meanwhile are handled after it", func(t *testing.T) {
		p, _ := epoch.Resume(cfg, t0, world(3, "a", "b", "c", "d"), view[:3])
		runScript(t, p, []step{
			{1 * ms, from("c", failure(4, "b")), nil},
			{2 * ms, from("b", pong(1, world(4, "a", "b", "c"))), nil},
			{3 * ms, from("c", pong(2, world(4, "a", "b", "c"))), outs(
				epoch.TookOver{World: world(4, "a", "b", "c"), Unheard: nil},
				epoch.Suspected{Name: "b", By: "c", Number: 4, Cause: "boom"}, ping("b", 3))},
			{4 * ms, from("b", pong(3, world(4, "a", "b", "c"))), outs(epoch.Cleared{Name: "b"})},
			{13 * ms, nil, propose(world(5, "a", "b", "c"), "a", "b", "c")},
		})
	})
}

// The proposer's deadline is when it next has something to do, and nothing
// when it has nothing to do: a caller arms one timer and sleeps.
func TestProposerDeadline(t *testing.T) {
	p := epoch.NewProposer(epoch.ProposerConfig{})
	if d := p.Deadline(); !d.IsZero() {
		t.Fatalf("an idle proposer asks for a tick at %v", d)
	}
	p.Step(t0, ready("a"))
	if d := p.Deadline(); !d.Equal(t0.Add(10 * ms)) {
		t.Fatalf("deadline %v, want the end of the coalescing wait", d)
	}
	p.Tick(t0.Add(10 * ms))
	if d := p.Deadline(); !d.Equal(t0.Add(35 * ms)) {
		t.Fatalf("deadline %v, want the first re-send (Resend after the proposal)", d)
	}
	if got := p.Unfinished(); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatalf("unfinished %v", got)
	}
}
