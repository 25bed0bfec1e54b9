package control_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/observe/stall"
	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

func TestStatsWireRoundTrip(t *testing.T) {
	in := stats.Batch{TotalSteps: 1000, Steps: []stats.Step{
		{Epoch: 3, Step: 17, Samples: 32, Compute: 12345 * time.Microsecond, StepTime: 20001 * time.Microsecond},
		{Epoch: 3, Step: 18, Compute: 0, StepTime: time.Millisecond},
		{Epoch: 4, Step: 19, Compute: time.Millisecond, StepTime: time.Millisecond, Loss: 0.5, HasLoss: true, Bytes: 4 << 20, Switch: 250 * time.Millisecond},
		{Epoch: 4, Step: 20, Compute: time.Millisecond, StepTime: time.Millisecond, Loss: 0, HasLoss: true},
	}}
	m, err := control.Decode(control.EncodeStats(in))
	if err != nil {
		t.Fatal(err)
	}
	if out := m.StatsBatch(); !slices.Equal(out.Steps, in.Steps) || out.TotalSteps != in.TotalSteps {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
	// Accumulation goes with every step, the gradient statistics with the
	// last: they are smoothed over many steps.
	grad := stats.Batch{Steps: []stats.Step{
		{Epoch: 2, Step: 5, Samples: 64, Compute: 3 * time.Microsecond, StepTime: 4 * time.Microsecond, Accum: 3, GradSqr: 1, GradVar: 2},
		{Epoch: 2, Step: 6, Samples: 64, Compute: 3 * time.Microsecond, StepTime: 4 * time.Microsecond, Accum: 1, GradSqr: 0.1234567890123e-7, GradVar: 3.5e300},
	}}
	m, err = control.Decode(control.EncodeStats(grad))
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(grad.Steps)
	want[0].GradSqr, want[0].GradVar = 0, 0
	if out := m.StatsBatch(); !slices.Equal(out.Steps, want) {
		t.Fatalf("with gradient statistics: %+v, want %+v", out.Steps, want)
	}
	// Statistics that are not finite (JSON has no infinity) are left out.
	grad.Steps[1].GradVar = math.Inf(1)
	if m, err = control.Decode(control.EncodeStats(grad)); err != nil || m.StatsBatch().Steps[1].GradVar != 0 {
		t.Fatalf("infinite variance: %+v, %v", m, err)
	}
	// The largest batch a session sends fits one membership message.
	big := stats.Batch{TotalSteps: 1 << 40}
	for i := range stats.MaxBatch {
		big.Steps = append(big.Steps, stats.Step{Epoch: 1 << 30, Step: 1<<40 + int64(i), Samples: 1 << 20, Compute: time.Hour, StepTime: time.Hour,
			Loss: -1.2345678e-38, HasLoss: true, Bytes: 1 << 40, Switch: time.Hour,
			Accum: 1 << 20, GradSqr: math.Pi * 1e-300, GradVar: -math.Pi * -1e300})
	}
	if n := len(control.EncodeStats(big)); n > 64<<10 {
		t.Fatalf("a full batch encodes to %d bytes, over the 64 KiB message limit", n)
	}
	// A loss travels with a float32's precision; one that is not a number
	// does not travel at all (JSON has no NaN).
	m, err = control.Decode(control.EncodeStats(stats.Batch{Steps: []stats.Step{
		{Epoch: 1, Step: 1, StepTime: time.Millisecond, Loss: 0.1, HasLoss: true},
		{Epoch: 1, Step: 2, StepTime: time.Millisecond, Loss: math.NaN(), HasLoss: true},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	out := m.StatsBatch().Steps
	if !out[0].HasLoss || float32(out[0].Loss) != float32(0.1) || out[1].HasLoss {
		t.Fatalf("losses: %+v", out)
	}
}

// TestStallWire: a stall snapshot survives the wire, and a long list of
// tensor names is cut to fit a message, saying how many were left out.
func TestStallWire(t *testing.T) {
	in := stall.Snapshot{Worker: "w1", Epoch: 5, Rank: 2, Size: 4, Started: 9, InFlight: true, Collective: "allreduce",
		Algorithm: "ring", Bytes: 4096, For: 3 * time.Second, WaitingOn: 1, Tensors: []string{"grad[0] float32×1024"},
		Taken: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	m, err := control.Decode(control.EncodeStall(in))
	if err != nil {
		t.Fatal(err)
	}
	want := in
	want.Worker = "" // the message's sender names it
	if m.Kind != control.KindStall || !reflect.DeepEqual(*m.Stall, want) {
		t.Fatalf("round trip: %+v, want %+v", *m.Stall, want)
	}
	if _, ok := m.Protocol(); ok {
		t.Fatal("a stall snapshot is not a protocol message")
	}
	many := in
	many.Tensors = nil
	for i := range 1000 {
		many.Tensors = append(many.Tensors, fmt.Sprintf("layer%d/%s", i, strings.Repeat("w", 300)))
	}
	b := control.EncodeStall(many)
	if len(b) > 16<<10 {
		t.Fatalf("1000 long tensor names encode to %d bytes", len(b))
	}
	m, err = control.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	names := m.Stall.Tensors
	if len(names) != 64 || names[63] != "… 937 more" || !strings.HasPrefix(names[0], "layer0/") || len(names[0]) != 128 {
		t.Fatalf("cut names: %d, last %q, first %d bytes", len(names), names[len(names)-1], len(names[0]))
	}
}

func TestDecodeControlRejects(t *testing.T) {
	for _, tc := range []struct{ name, msg string }{
		{"not json", `{"t":"stats"`},
		{"unknown type", `{"t":"bogus"}`},
		{"stats without steps", `{"t":"stats"}`},
		{"stats step 0", `{"t":"stats","s":[{"e":1,"n":0,"c":1,"d":2}]}`},
		{"stats epoch 0", `{"t":"stats","s":[{"e":0,"n":1,"c":1,"d":2}]}`},
		{"compute over step time", `{"t":"stats","s":[{"e":1,"n":1,"c":3,"d":2}]}`},
		{"negative samples", `{"t":"stats","s":[{"e":1,"n":1,"b":-1,"c":1,"d":2}]}`},
		{"negative total", `{"t":"stats","T":-5,"s":[{"e":1,"n":1,"c":1,"d":2}]}`},
		{"negative accumulation", `{"t":"stats","s":[{"e":1,"n":1,"c":1,"d":2,"a":-1}]}`},
		{"negative gradient variance", `{"t":"stats","s":[{"e":1,"n":1,"c":1,"d":2}],"q":1,"v":-2}`},
		{"negative bytes", `{"t":"stats","s":[{"e":1,"n":1,"c":1,"d":2,"y":-1}]}`},
		{"negative switch", `{"t":"stats","s":[{"e":1,"n":1,"c":1,"d":2,"w":-1}]}`},
		{"loss not a number", `{"t":"stats","s":[{"e":1,"n":1,"c":1,"d":2,"l":"x"}]}`},
		{"epoch without members", `{"t":"epoch","n":3}`},
		{"repeated member", `{"t":"epoch","n":3,"m":[{"Name":"a","Addr":"x"},{"Name":"a","Addr":"y"}]}`},
		{"failure without epoch", `{"t":"failure","b":"a"}`},
		{"failure numbered 2^64-1", `{"t":"failure","n":18446744073709551615}`},
		{"done above the maximum epoch", `{"t":"done","n":4611686018427387905}`},
		{"epoch above the maximum", `{"t":"epoch","n":4611686018427387905,"m":[{"Name":"a","Addr":"x"}]}`},
		{"pong above the maximum", `{"t":"pong","o":1,"n":4611686018427387905,"m":[{"Name":"a","Addr":"x"}]}`},
		{"stats above the maximum epoch", `{"t":"stats","s":[{"e":4611686018427387905,"n":1,"c":1,"d":2}]}`},
		{"stall above the maximum epoch", `{"t":"stall","x":{"epoch":4611686018427387905,"rank":0,"size":2,"waiting_on":-1}}`},
		{"ping without nonce", `{"t":"ping"}`},
		{"pong without nonce or world (an acknowledgement carries one)", `{"t":"pong"}`},
		{"pong with a number only", `{"t":"pong","o":1,"n":2}`},
		{"pong with members only", `{"t":"pong","o":1,"m":[{"Name":"a","Addr":"x"}]}`},
		{"pong with a repeated member", `{"t":"pong","o":1,"n":2,"m":[{"Name":"a","Addr":"x"},{"Name":"a","Addr":"x"}]}`},
		{"ping with a world", `{"t":"ping","o":1,"n":2,"m":[{"Name":"a","Addr":"x"}]}`},
		{"final failure", `{"t":"failure","n":3,"f":true}`},
		{"final pong", `{"t":"pong","o":1,"f":true}`},
		{"stall without snapshot", `{"t":"stall"}`},
		{"stall epoch 0", `{"t":"stall","x":{"epoch":0,"rank":0,"size":2,"waiting_on":-1}}`},
		{"stall rank outside world", `{"t":"stall","x":{"epoch":1,"rank":2,"size":2,"waiting_on":-1}}`},
		{"stall waiting on a stranger", `{"t":"stall","x":{"epoch":1,"rank":0,"size":2,"waiting_on":5}}`},
		{"stall negative wait", `{"t":"stall","x":{"epoch":1,"rank":0,"size":2,"waiting_on":1,"in_flight":true,"started":1,"for_ns":-1}}`},
		{"stall in flight before any", `{"t":"stall","x":{"epoch":1,"rank":0,"size":2,"waiting_on":1,"in_flight":true,"started":0}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := control.Decode([]byte(tc.msg))
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(tc.name, "maximum") || strings.Contains(tc.name, "2^64") {
				if !errors.Is(err, epoch.ErrNumberOutOfRange) {
					t.Fatalf("%v does not wrap epoch.ErrNumberOutOfRange", err)
				}
			}
		})
	}
}

// FuzzDecodeControl: whatever arrives on the gossip channel, decoding returns
// a checked message or an error, and an accepted message re-encodes.
func FuzzDecodeControl(f *testing.F) {
	f.Add(control.EncodeStats(stats.Batch{TotalSteps: 9, Steps: []stats.Step{{Epoch: 1, Step: 1, Samples: 2, Compute: 1, StepTime: 2}}}))
	f.Add(control.EncodeStats(stats.Batch{Steps: []stats.Step{{Epoch: 1, Step: 1, Samples: 2, Compute: 1, StepTime: 2, Accum: 3, GradSqr: 0.5, GradVar: 1e-3}}}))
	f.Add(control.EncodeEpoch(epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}))
	f.Add(control.EncodeFailure(3, "a", errors.New("boom")))
	f.Add(control.EncodePing(7))
	f.Add(control.EncodePong(7, epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}))
	f.Add(control.EncodeDone(4))
	f.Add(control.EncodeDone(epoch.MaxNumber))
	f.Add(control.EncodeFailure(math.MaxUint64, "a", nil))
	f.Add(control.Encode(epoch.Message{Kind: epoch.MsgEpoch, World: epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}, Final: true}))
	f.Add(control.EncodeStall(stall.Snapshot{Epoch: 2, Rank: 1, Size: 3, Started: 4, InFlight: true, Collective: "allreduce",
		For: time.Second, WaitingOn: 2, Tensors: []string{"grad[0] float32×10"}}))
	// An empty member list in a pong that knows no world (CI's fuzzing found
	// it decoding to an empty slice and re-encoding to none).
	f.Add([]byte(`{"t":"pong","o":1,"m":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := control.Decode(b)
		if err != nil {
			return
		}
		if m.Number > epoch.MaxNumber {
			t.Fatalf("accepted epoch number %d, above the maximum", m.Number)
		}
		if pm, ok := m.Protocol(); ok {
			again, err := control.Decode(control.Encode(pm))
			if err != nil {
				t.Fatalf("%+v re-encodes to something Decode rejects: %v", pm, err)
			}
			if pm2, _ := again.Protocol(); !reflect.DeepEqual(pm2, pm) {
				t.Fatalf("re-encoding changed %+v into %+v", pm, pm2)
			}
		}
		switch m.Kind {
		case control.KindStats:
			b := m.StatsBatch()
			for _, s := range b.Steps {
				if s.Compute > s.StepTime || s.Step < 1 || s.Epoch == 0 || s.Bytes < 0 || s.Switch < 0 ||
					s.Accum < 0 || s.GradSqr < 0 || s.GradVar < 0 {
					t.Fatalf("accepted an impossible step %+v", s)
				}
			}
			again, err := control.Decode(control.EncodeStats(b))
			if err != nil {
				t.Fatalf("%+v re-encodes to something Decode rejects: %v", b, err)
			}
			if len(again.StatsBatch().Steps) != len(b.Steps) {
				t.Fatalf("re-encoding lost steps")
			}
		case control.KindStall:
			if _, err := control.Decode(control.EncodeStall(*m.Stall)); err != nil {
				t.Fatalf("%+v re-encodes to something Decode rejects: %v", *m.Stall, err)
			}
		}
	})
}

// Every protocol message survives the wire: Encode, Decode, Protocol give it
// back unchanged (a failure's cause cut to its limit).
func TestProtocolWireRoundTrip(t *testing.T) {
	w := epoch.World{Number: 7, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}, {Name: "b", Addr: "127.0.0.1:2"}}}
	long := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		in, want epoch.Message
	}{
		{in: epoch.Message{Kind: epoch.MsgEpoch, World: w}},
		{in: epoch.Message{Kind: epoch.MsgEpoch, World: w, Final: true}},
		{in: epoch.Message{Kind: epoch.MsgFailure, Number: 7, Blamed: "b", Cause: "peer closed"}},
		{in: epoch.Message{Kind: epoch.MsgFailure, Number: 7}},
		{in: epoch.Message{Kind: epoch.MsgFailure, Number: 7, Cause: long},
			want: epoch.Message{Kind: epoch.MsgFailure, Number: 7, Cause: long[:512]}},
		{in: epoch.Message{Kind: epoch.MsgPing, Nonce: 3}},
		{in: epoch.Message{Kind: epoch.MsgPong, Nonce: 3, World: w}},
		{in: epoch.Message{Kind: epoch.MsgPong, Nonce: 3}},
		{in: epoch.Message{Kind: epoch.MsgDone, Number: 7}},
	} {
		t.Run(tc.in.String(), func(t *testing.T) {
			want := tc.want
			if want.Kind == 0 {
				want = tc.in
			}
			m, err := control.Decode(control.Encode(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := m.Protocol()
			if !ok || !reflect.DeepEqual(got, want) {
				t.Fatalf("got %+v (%v), want %+v", got, ok, want)
			}
		})
	}
	if _, ok := (control.Message{Kind: control.KindStats}).Protocol(); ok {
		t.Fatal("step statistics taken for a protocol message")
	}
}
