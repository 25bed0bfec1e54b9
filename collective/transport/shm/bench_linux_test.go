package shm_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/conformance"
)

// benchLinks connects two transports of this process; both ends share the
// process's CPUs, so these measure the ring and the waits, not placement.
func benchLinks(b *testing.B, singleCopy int) (transport.Link, transport.Link) {
	cfg := testConfig()
	cfg.SingleCopyBytes = singleCopy
	return conformance.ConnectPair(b, listen(b, cfg), listen(b, cfg))
}

// BenchmarkPingPong: a 4 KiB frame there and back; one op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	a, z := benchLinks(b, 0)
	conformance.PingPong(b, context.Background(), a, z, 4<<10)
}

// BenchmarkStream: rank 0 streams frames to rank 1, through the ring or by
// single copy.
func BenchmarkStream(b *testing.B) {
	for _, tc := range []struct {
		name       string
		singleCopy int
	}{{"ring", -1}, {"single-copy", singleCopyOn}} {
		for _, n := range []int{256 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", tc.name, n>>10), func(b *testing.B) {
				a, z := benchLinks(b, tc.singleCopy)
				conformance.Stream(b, context.Background(), a, z, n)
			})
		}
	}
}
