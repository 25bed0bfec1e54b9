package tcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

func benchLinks(b *testing.B) (transport.Link, transport.Link) {
	trs := listenN(b, 2, testConfig())
	ctx := timeoutCtx(b, 30*time.Second)
	links := connectAll(b, ctx, trs, "bench", 1)
	return links[0][1], links[1][0]
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
			const n = 4 << 10
			out, in, echo := make([]byte, n), make([]byte, n), make([]byte, n)
			done := make(chan error, 1)
			rounds := b.N
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
		})
	}
}

// BenchmarkStream: rank 0 streams 1 MiB frames to rank 1.
func BenchmarkStream(b *testing.B) {
	a, z := benchLinks(b)
	ctx := context.Background()
	const n = 1 << 20
	out, in := make([]byte, n), make([]byte, n)
	done := make(chan error, 1)
	frames := b.N
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
	h := transport.Header{Kind: transport.FrameData, Length: n}
	b.SetBytes(n)
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
}
