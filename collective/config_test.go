package collective

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective/transport"
)

func TestConfigZeroFieldsAreDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"defaults", DefaultConfig(), true},
		{"no small messages", Config{SmallMessageBytes: -1}, true},
		{"chunk too small", Config{ChunkBytes: 63}, false},
		{"negative chunk", Config{ChunkBytes: -1}, false},
		{"chunk over a frame", Config{ChunkBytes: transport.MaxPayload + 1}, false},
		{"negative abort timeout", Config{AbortTimeout: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
	got, want := Config{}.WithDefaults(), DefaultConfig()
	if got.SmallMessageBytes != want.SmallMessageBytes || got.ChunkBytes != want.ChunkBytes || got.AbortTimeout != want.AbortTimeout || got.Logger == nil {
		t.Fatalf("Config{}.WithDefaults() = %+v, want %+v", got, want)
	}
	// A communicator built from the zero Config runs collectives.
	comms := newWorld(t, inprocMesh, 3, Config{})
	noErrors(t, onAll(t, comms, 10*time.Second, func(ctx context.Context, c *Communicator) error {
		x := []float64{float64(c.Rank()), 1}
		if err := Allreduce(ctx, c, x, x, Sum); err != nil {
			return err
		}
		if x[0] != 3 || x[1] != 3 {
			t.Errorf("rank %d: sum %v, want [3 3]", c.Rank(), x)
		}
		return nil
	}))
	if _, err := NewFromLinks(transport.World{JobID: "j", Addrs: []string{"a"}}, []transport.Link{nil}, Config{ChunkBytes: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewFromLinks with ChunkBytes 1: %v", err)
	}
}

// hintLink is a link that suggests a chunk for oversubscribed worlds
// (transport.ChunkHinter); only OversubscribedChunkBytes is called.
type hintLink struct {
	transport.Link
	hint int
}

func (l hintLink) OversubscribedChunkBytes() int { return l.hint }

// TestChunkBytes: ChunkBytes left at 0 follows the transport's suggestion on
// a world of one host whose ranks outnumber its CPUs (every rank of the
// host decides alike), and only when every link makes it; a configured
// chunk always wins.
func TestChunkBytes(t *testing.T) {
	const mib = 1 << 20
	hinted := func(hints ...int) []transport.Link {
		links := []transport.Link{nil} // this rank's
		for _, h := range hints {
			links = append(links, hintLink{hint: h})
		}
		return links
	}
	type plain struct{ transport.Link } // no ChunkHinter
	for _, tc := range []struct {
		name              string
		configured        int
		hosts, local, cpu int
		links             []transport.Link
		want              int
	}{
		{"4 ranks on 2 CPUs, every link suggests 1 MiB", 0, 1, 4, 2, hinted(mib, mib, mib), mib},
		{"3 ranks on 2 CPUs", 0, 1, 3, 2, hinted(mib, mib), mib},
		{"2 ranks on 2 CPUs", 0, 1, 2, 2, hinted(mib), DefaultChunkBytes},
		{"4 ranks on 8 CPUs", 0, 1, 4, 8, hinted(mib, mib, mib), DefaultChunkBytes},
		{"configured wins", 64 << 10, 1, 4, 2, hinted(mib, mib, mib), 64 << 10},
		{"configured 256 KiB wins", DefaultChunkBytes, 1, 4, 2, hinted(mib, mib, mib), DefaultChunkBytes},
		{"no suggestion (shared memory)", 0, 1, 4, 2, hinted(0, 0, 0), DefaultChunkBytes},
		{"links that cannot suggest", 0, 1, 3, 2, []transport.Link{nil, plain{}, plain{}}, DefaultChunkBytes},
		{"one link without a suggestion", 0, 1, 4, 2, hinted(mib, 0, mib), DefaultChunkBytes},
		{"links that disagree", 0, 1, 4, 2, hinted(mib, 2*mib, mib), DefaultChunkBytes},
		{"one of them cannot suggest", 0, 1, 3, 2, []transport.Link{hintLink{hint: mib}, nil, plain{}}, DefaultChunkBytes},
		{"two hosts: ranks elsewhere may see other CPUs", 0, 2, 4, 2, hinted(mib, mib, mib, mib, mib, mib, mib), DefaultChunkBytes},
		{"a world of one rank", 0, 1, 1, 0, hinted(), DefaultChunkBytes},
		{"a suggestion below 64 bytes", 0, 1, 3, 2, hinted(32, 32), DefaultChunkBytes},
		{"a suggestion over a frame", 0, 1, 2, 1, hinted(transport.MaxPayload + 1), DefaultChunkBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chunkBytes(tc.configured, tc.hosts, tc.local, tc.cpu, chunkHints(tc.links)); got != tc.want {
				t.Fatalf("chunkBytes(%d, %d hosts, %d local ranks, %d CPUs, %v) = %d, want %d",
					tc.configured, tc.hosts, tc.local, tc.cpu, chunkHints(tc.links), got, tc.want)
			}
		})
	}
}
