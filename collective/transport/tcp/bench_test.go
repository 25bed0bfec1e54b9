package tcp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

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

// BenchmarkWorldChange: every member of a world of 16 on this host moves
// into the next world (the same members), either keeping its links
// (transport.Carry: a rekey frame and its confirmation each way per link,
// on its first lane) or dialling them all again (Connect: a handshake per
// connection); one op is one world change of all 16, authenticated, with 1
// lane per link and with 4 (autoLanes, as between hosts by default).
func BenchmarkWorldChange(b *testing.B) {
	const n = 16
	for _, lanes := range []int{1, 4} {
		for _, keep := range []bool{true, false} {
			name := "redial"
			if keep {
				name = "keep"
			}
			b.Run(fmt.Sprintf("%s/lanes=%d", name, lanes), func(b *testing.B) {
				cfg := testConfig()
				cfg.Lanes = lanes
				trs := listenN(b, n, cfg)
				members := make([]int, n)
				for i := range members {
					members[i] = i
				}
				ctx := context.Background()
				worldOf := func(epoch uint64, r int) transport.World {
					return world{epoch, members}.of(trs, r)
				}
				links := make([][]transport.Link, n)
				move := func(epoch uint64, carry bool) {
					errs := make([]error, n)
					var wg sync.WaitGroup
					for r := range n {
						wg.Go(func() {
							if carry {
								links[r], _, errs[r] = transport.Carry(ctx, trs[r], worldOf(epoch, r), links[r], nil)
								return
							}
							for _, l := range links[r] {
								if l != nil {
									l.Close()
								}
							}
							links[r], errs[r] = trs[r].Connect(ctx, worldOf(epoch, r))
						})
					}
					wg.Wait()
					if err := errors.Join(errs...); err != nil {
						b.Fatal(err)
					}
				}
				move(1, false)
				b.Cleanup(func() { conformance.CloseAll(links) })
				epoch := uint64(1)
				cpu := processCPU(b)
				b.ResetTimer()
				for range b.N {
					epoch++
					move(epoch, keep)
				}
				b.StopTimer()
				// The process's CPU (user and system), every member's
				// together: on a busy host it is what a change takes from
				// the training around it.
				b.ReportMetric(float64((processCPU(b)-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/change")
			})
		}
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
