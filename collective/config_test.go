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
