package sctp

import (
	"context"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// BenchmarkStream: one association, rank 0 streams frames of the given size
// to rank 1 (go test -bench Stream ./collective/transport/sctp).
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(sizeName(n), func(b *testing.B) {
			a, z := benchPair(b)
			stream(b, a, z, n)
		})
	}
}

// BenchmarkPingPong: a 4 KiB frame there and back; one op is one round trip.
func BenchmarkPingPong(b *testing.B) {
	a, z := benchPair(b)
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
	b.ResetTimer()
	start := time.Now()
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
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(rounds), "µs/roundtrip")
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return string(rune('0'+n>>20)) + "MiB"
	}
	return "64KiB"
}

func benchPair(b *testing.B) (transport.Link, transport.Link) {
	cfg := testCfg()
	trs := make([]*Transport, 2)
	for i := range trs {
		tr, err := Listen(cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tr.Close() })
		trs[i] = tr
	}
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

func stream(b *testing.B, a, z transport.Link, n int) {
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
	b.ResetTimer()
	for range frames {
		if err := a.Send(ctx, &h, out); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
