package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/collective/transport/tcp"
)

// tcpMesh connects a world over real loopback sockets, one transport per rank.
func tcpMesh(t testing.TB, w transport.World) [][]transport.Link {
	t.Helper()
	return connectMesh(t, w, func() (transport.Transport, string, error) {
		cfg := tcp.DefaultConfig()
		cfg.Secret = []byte("collective-test-secret")
		cfg.IOTimeout = 10 * time.Second
		tr, err := tcp.Listen(cfg)
		if err != nil {
			return nil, "", err
		}
		return tr, tr.Addr(), nil
	})
}

// connectMesh connects a world of transports that listen returns, one per
// rank, all in this process.
func connectMesh(t testing.TB, w transport.World, listen func() (transport.Transport, string, error)) [][]transport.Link {
	t.Helper()
	p := w.Size()
	ts := make([]transport.Transport, p)
	addrs := make([]string, p)
	for r := range ts {
		tr, addr, err := listen()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		ts[r], addrs[r] = tr, addr
	}
	mesh := make([][]transport.Link, p)
	errs := make([]error, p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range ts {
		wg.Go(func() {
			wr := w
			wr.Rank, wr.Addrs = r, addrs
			mesh[r], errs[r] = ts[r].Connect(ctx, wr)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d connect: %v", r, err)
		}
	}
	return mesh
}

// BenchmarkAllreduceTCP runs float32 sum allreduce among goroutine ranks over
// loopback TCP; bytes/s is the algorithm bandwidth.
func BenchmarkAllreduceTCP(b *testing.B) {
	for _, p := range []int{2, 4} {
		for _, size := range []int{4 << 10, 256 << 10, 4 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("p=%d/%dKiB", p, size>>10), func(b *testing.B) {
				comms := newWorld(b, tcpMesh, p, DefaultConfig())
				bufs := make([][]float32, p)
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				errs := onAll(b, comms, 10*time.Minute, func(ctx context.Context, c *Communicator) error {
					for range b.N {
						if err := Allreduce(ctx, c, bufs[c.Rank()], bufs[c.Rank()], Sum); err != nil {
							return err
						}
					}
					return nil
				})
				noErrors(b, errs)
			})
		}
	}
}

// BenchmarkAllreduceAlgorithms runs float32 sum allreduce among goroutine
// ranks on declared hosts (shared memory inside each, loopback TCP between
// them: hostsMesh) with each algorithm forced; bytes/s is the algorithm
// bandwidth. Loopback TCP runs at memory speed, so this measures the
// algorithms' CPU and step costs, not a network link's limit.
func BenchmarkAllreduceAlgorithms(b *testing.B) {
	for _, l := range []hostLayout{blocked(2, 2), blocked(1, 3)} {
		for _, alg := range []Algorithm{AlgorithmAuto, AlgorithmRing, AlgorithmHierarchical, AlgorithmRecursiveDoubling} {
			for _, size := range []int{4 << 10, 256 << 10, 4 << 20, 64 << 20} {
				if alg == AlgorithmRecursiveDoubling && size > 4<<20 {
					continue
				}
				b.Run(fmt.Sprintf("%s/alg=%s/%dKiB", l.name, alg, size>>10), func(b *testing.B) {
					cfg := DefaultConfig()
					cfg.Algorithm = alg
					comms := newHostWorld(b, hostsMesh, l, cfg)
					bufs := make([][]float32, len(comms))
					for r := range bufs {
						bufs[r] = make([]float32, size/4)
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					errs := onAll(b, comms, 10*time.Minute, func(ctx context.Context, c *Communicator) error {
						for range b.N {
							if err := Allreduce(ctx, c, bufs[c.Rank()], bufs[c.Rank()], Sum); err != nil {
								return err
							}
						}
						return nil
					})
					noErrors(b, errs)
				})
			}
		}
	}
}
