package tcp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

var benchSecurity = []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated, transport.SecurityEncrypted}

func benchLinks(b *testing.B, sec transport.Security) (transport.Link, transport.Link) {
	return benchLinksLanes(b, sec, 0)
}

func benchLinksLanes(b *testing.B, sec transport.Security, lanes int) (transport.Link, transport.Link) {
	cfg := testConfig()
	cfg.Security = sec
	cfg.Lanes = lanes
	trs := listenN(b, 2, cfg)
	return conformance.ConnectPair(b, trs[0], trs[1])
}

// BenchmarkPingPong: rank 0 sends a 4 KiB frame, rank 1 sends it back; one
// op is one round trip. Per data-plane setting.
func BenchmarkPingPong(b *testing.B) {
	for _, sec := range benchSecurity {
		for _, tc := range []struct {
			name string
			ctx  func() (context.Context, context.CancelFunc)
		}{
			{"4KiB", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
			// A cancellable context costs a context.AfterFunc per call.
			{"4KiB-cancellable", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }},
		} {
			b.Run(sec.String()+"/"+tc.name, func(b *testing.B) {
				a, z := benchLinks(b, sec)
				ctx, cancel := tc.ctx()
				defer cancel()
				conformance.PingPong(b, ctx, a, z, 4<<10)
			})
		}
	}
}

// BenchmarkStream: rank 0 streams 1 MiB frames to rank 1, per data-plane
// setting.
func BenchmarkStream(b *testing.B) {
	for _, sec := range benchSecurity {
		b.Run(sec.String(), func(b *testing.B) {
			a, z := benchLinks(b, sec)
			conformance.Stream(b, context.Background(), a, z, 1<<20)
		})
	}
}

// BenchmarkStreamLanes: rank 0 streams 1 MiB frames to rank 1 over links of
// 1, 2 and 4 lanes (loopback: what striping costs and gains when the two
// ends share this machine's cores).
func BenchmarkStreamLanes(b *testing.B) {
	for _, sec := range []transport.Security{transport.SecurityPlain, transport.SecurityAuthenticated} {
		for _, lanes := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%v/lanes=%d", sec, lanes), func(b *testing.B) {
				a, z := benchLinksLanes(b, sec, lanes)
				conformance.Stream(b, context.Background(), a, z, 1<<20)
			})
		}
	}
}
