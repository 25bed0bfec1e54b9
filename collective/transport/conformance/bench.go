package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

// The benchmarks every transport runs over its own links, kept here so that
// the transports' figures measure the same loop.

// ConnectPair connects a as rank 0 and z as rank 1 of a two-rank world and
// returns a's link to z and z's link to a, which are closed when tb ends.
func ConnectPair(tb testing.TB, a, z transport.Transport) (transport.Link, transport.Link) {
	tb.Helper()
	addrs := []string{a.Addr(), z.Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	links := make([][]transport.Link, 2)
	errs := make([]error, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		links[1], errs[1] = z.Connect(ctx, transport.World{JobID: "pair", Epoch: 1, Rank: 1, Addrs: addrs})
	}()
	links[0], errs[0] = a.Connect(ctx, transport.World{JobID: "pair", Epoch: 1, Rank: 0, Addrs: addrs})
	<-done
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: Connect: %v", r, err)
		}
	}
	tb.Cleanup(func() { links[0][1].Close(); links[1][0].Close() })
	return links[0][1], links[1][0]
}

// PingPong sends an n-byte frame from a to z and back; one op is one round
// trip.
func PingPong(b *testing.B, ctx context.Context, a, z transport.Link, n int) {
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
	h := transport.Header{Kind: transport.FrameData, Length: uint32(n)}
	var rh transport.Header
	b.SetBytes(2 * int64(n))
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
}

// Stream sends n-byte frames from a to z; one op is one frame.
func Stream(b *testing.B, ctx context.Context, a, z transport.Link, n int) {
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
}
