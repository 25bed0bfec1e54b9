package collective

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// replicateBenchBytes is the state BenchmarkReplicateJoiner moves: 1 GiB of
// float32.
const replicateBenchBytes = 1 << 30

// BenchmarkReplicateJoiner moves a 1 GiB float32 buffer into one receiver
// (a joiner) from 1, 2, 4 and 8 holders at once (Config.StripeSources),
// among 9 goroutine ranks over loopback TCP; bytes/s is what the joiner
// takes in. The 8 holders share one buffer (they only read it), so the
// benchmark holds 2 GiB, not 9.
func BenchmarkReplicateJoiner(b *testing.B) {
	src := make([]byte, replicateBenchBytes)
	for i := 0; i < len(src); i += 4096 {
		src[i] = byte(i >> 12)
	}
	dst := make([]byte, replicateBenchBytes)
	holders, joiner := []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{8}
	for _, k := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("sources=%d", k), func(b *testing.B) {
			comms := newWorld(b, tcpMesh, 9, Config{StripeSources: k})
			clear(dst)
			b.SetBytes(replicateBenchBytes)
			b.ResetTimer()
			noErrors(b, onAll(b, comms, 10*time.Minute, func(ctx context.Context, c *Communicator) error {
				buf := src
				if c.Rank() == joiner[0] {
					buf = dst
				}
				for range b.N {
					if err := c.Replicate(ctx, HostBuffer(Float32, buf), holders, joiner); err != nil {
						return err
					}
				}
				return nil
			}))
			b.StopTimer()
			if !bytes.Equal(dst, src) {
				b.Fatal("the joiner's copy differs from the holders'")
			}
		})
	}
}
