package tcp_test

import (
	"context"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

func benchLinks(b *testing.B) (transport.Link, transport.Link) {
	trs := listenN(b, 2, testConfig())
	return conformance.ConnectPair(b, trs[0], trs[1])
}

// BenchmarkPingPong: rank 0 sends a 4 KiB frame, rank 1 sends it back; one
// op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"4KiB", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
		// A cancellable context costs a context.AfterFunc per call.
		{"4KiB-cancellable", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			a, z := benchLinks(b)
			ctx, cancel := tc.ctx()
			defer cancel()
			conformance.PingPong(b, ctx, a, z, 4<<10)
		})
	}
}

// BenchmarkStream: rank 0 streams 1 MiB frames to rank 1.
func BenchmarkStream(b *testing.B) {
	a, z := benchLinks(b)
	conformance.Stream(b, context.Background(), a, z, 1<<20)
}
