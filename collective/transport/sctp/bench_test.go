package sctp

import (
	"context"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// BenchmarkStream: one association, rank 0 streams frames of the given size
// to rank 1 (go test -bench Stream ./collective/transport/sctp).
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(sizeName(n), func(b *testing.B) {
			a, z := benchPair(b)
			conformance.Stream(b, context.Background(), a, z, n)
		})
	}
}

// BenchmarkPingPong: a 4 KiB frame there and back; one op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	a, z := benchPair(b)
	conformance.PingPong(b, context.Background(), a, z, 4<<10)
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return string(rune('0'+n>>20)) + "MiB"
	}
	return "64KiB"
}

func benchPair(b *testing.B) (transport.Link, transport.Link) {
	a, z := pairOf(b, testCfg())
	return a, z
}
