package shm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/shm"
)

// benchLinks connects two transports of this process; both ends share the
// process's CPUs, so these measure the ring and the waits, not placement.
func benchLinks(b *testing.B, singleCopy int) (transport.Link, transport.Link) {
	cfg := testConfig()
	cfg.SingleCopyBytes = singleCopy
	trs := []*shm.Transport{listen(b, cfg), listen(b, cfg)}
	addrs := []string{trs[0].Addr(), trs[1].Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := make(chan []transport.Link, 1)
	go func() {
		l, err := trs[1].Connect(ctx, transport.World{JobID: "bench", Epoch: 1, Rank: 1, Addrs: addrs})
		if err != nil {
			b.Error(err)
		}
		res <- l
	}()
	l0, err := trs[0].Connect(ctx, transport.World{JobID: "bench", Epoch: 1, Rank: 0, Addrs: addrs})
	if err != nil {
		b.Fatal(err)
	}
	l1 := <-res
	if l1 == nil {
		b.FailNow()
	}
	b.Cleanup(func() { l0[1].Close(); l1[0].Close() })
	return l0[1], l1[0]
}

// BenchmarkPingPong: a 4 KiB frame there and back; one op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	a, z := benchLinks(b, 0)
	ctx := context.Background()
	const n = 4 << 10
	out, in, echo := make([]byte, n), make([]byte, n), make([]byte, n)
	rounds := b.N
	done := make(chan error, 1)
	go func() {
		var h transport.Header
		for range rounds {
			if err := z.RecvHeader(ctx, &h); err != nil {
				done <- err
				return
			}
			if err := z.RecvPayload(ctx, echo); err != nil {
				done <- err
				return
			}
			if err := z.Send(ctx, &h, echo); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	h := transport.Header{Kind: transport.FrameData, Length: n}
	var rh transport.Header
	b.SetBytes(2 * n)
	b.ReportAllocs()
	b.ResetTimer()
	for range rounds {
		if err := a.Send(ctx, &h, out); err != nil {
			b.Fatal(err)
		}
		if err := a.RecvHeader(ctx, &rh); err != nil {
			b.Fatal(err)
		}
		if err := a.RecvPayload(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStream: rank 0 streams frames to rank 1, through the ring or by
// single copy.
func BenchmarkStream(b *testing.B) {
	for _, tc := range []struct {
		name       string
		singleCopy int
	}{{"ring", -1}, {"single-copy", 0}} {
		for _, n := range []int{256 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", tc.name, n>>10), func(b *testing.B) {
				a, z := benchLinks(b, tc.singleCopy)
				ctx := context.Background()
				out, in := make([]byte, n), make([]byte, n)
				frames := b.N
				done := make(chan error, 1)
				go func() {
					var h transport.Header
					for range frames {
						if err := z.RecvHeader(ctx, &h); err != nil {
							done <- err
							return
						}
						if err := z.RecvPayload(ctx, in); err != nil {
							done <- err
							return
						}
					}
					done <- nil
				}()
				h := transport.Header{Kind: transport.FrameData, Length: uint32(n)}
				b.SetBytes(int64(n))
				b.ReportAllocs()
				b.ResetTimer()
				for range frames {
					if err := a.Send(ctx, &h, out); err != nil {
						b.Fatal(err)
					}
				}
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
