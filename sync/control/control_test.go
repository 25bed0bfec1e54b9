package control_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/sync/control"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/stats"
)

func TestStatsWireRoundTrip(t *testing.T) {
	in := stats.Batch{TotalSteps: 1000, Steps: []stats.Step{
		{Epoch: 3, Step: 17, Samples: 32, Compute: 12345 * time.Microsecond, StepTime: 20001 * time.Microsecond},
		{Epoch: 3, Step: 18, Compute: 0, StepTime: time.Millisecond},
	}}
	m, err := control.Decode(control.EncodeStats(in))
	if err != nil {
		t.Fatal(err)
	}
	if out := m.StatsBatch(); !slices.Equal(out.Steps, in.Steps) || out.TotalSteps != in.TotalSteps {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
	// The largest batch a session sends fits one membership message.
	big := stats.Batch{TotalSteps: 1 << 40}
	for i := range stats.MaxBatch {
		big.Steps = append(big.Steps, stats.Step{Epoch: 1 << 30, Step: 1<<40 + int64(i), Samples: 1 << 20, Compute: time.Hour, StepTime: time.Hour})
	}
	if n := len(control.EncodeStats(big)); n > 64<<10 {
		t.Fatalf("a full batch encodes to %d bytes, over the 64 KiB message limit", n)
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
		{"epoch without members", `{"t":"epoch","n":3}`},
		{"repeated member", `{"t":"epoch","n":3,"m":[{"Name":"a","Addr":"x"},{"Name":"a","Addr":"y"}]}`},
		{"failure without epoch", `{"t":"failure","b":"a"}`},
		{"ping without nonce", `{"t":"ping"}`},
		{"pong without nonce", `{"t":"pong","n":2,"m":[{"Name":"a","Addr":"x"}]}`},
		{"pong with a number only", `{"t":"pong","o":1,"n":2}`},
		{"pong with members only", `{"t":"pong","o":1,"m":[{"Name":"a","Addr":"x"}]}`},
		{"pong with a repeated member", `{"t":"pong","o":1,"n":2,"m":[{"Name":"a","Addr":"x"},{"Name":"a","Addr":"x"}]}`},
		{"ping with a world", `{"t":"ping","o":1,"n":2,"m":[{"Name":"a","Addr":"x"}]}`},
		{"final failure", `{"t":"failure","n":3,"f":true}`},
		{"final pong", `{"t":"pong","o":1,"f":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := control.Decode([]byte(tc.msg)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// FuzzDecodeControl: whatever arrives on the gossip channel, decoding returns
// a checked message or an error, and an accepted message re-encodes.
func FuzzDecodeControl(f *testing.F) {
	f.Add(control.EncodeStats(stats.Batch{TotalSteps: 9, Steps: []stats.Step{{Epoch: 1, Step: 1, Samples: 2, Compute: 1, StepTime: 2}}}))
	f.Add(control.EncodeEpoch(epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}))
	f.Add(control.EncodeFailure(3, "a", errors.New("boom")))
	f.Add(control.EncodePing(7))
	f.Add(control.EncodePong(7, epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}))
	f.Add(control.EncodeDone(4))
	f.Add(control.Encode(epoch.Message{Kind: epoch.MsgEpoch, World: epoch.World{Number: 2, Members: []epoch.Member{{Name: "a", Addr: "127.0.0.1:1"}}}, Final: true}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := control.Decode(b)
		if err != nil {
			return
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
		if m.Kind == control.KindStats {
			for _, s := range m.StatsBatch().Steps {
				if s.Compute > s.StepTime || s.Step < 1 || s.Epoch == 0 {
					t.Fatalf("accepted an impossible step %+v", s)
				}
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
