package sync

import (
	"bytes"
	"testing"
)

// FuzzGoodputStates: the gradient noise measurement's and the adaptive
// policy's state blobs arrive from rank 0 in a joining worker's state.
// Whatever the bytes, decoding returns an error or a state that encodes and
// decodes again to the same bytes — never a panic.
func FuzzGoodputStates(f *testing.F) {
	noise, err := newGradNoise(NoiseConfig{Measure: true, InitBatch: 64})
	if err != nil {
		f.Fatal(err)
	}
	seed, err := noise.marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	a, err := NewAdaptiveBatch(AdaptiveConfig{InitBatch: 64, MaxBatch: 1024})
	if err != nil {
		f.Fatal(err)
	}
	if seed, err = a.marshal(); err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"init_batch":-1}`))
	f.Add([]byte(`{"target":0,"lr_factor":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := newGradNoise(NoiseConfig{Measure: true})
		if err != nil {
			t.Fatal(err)
		}
		if g.unmarshal(b) == nil {
			roundTrip(t, "gradient noise", g.marshal, g.unmarshal)
		}
		p, err := NewAdaptiveBatch(AdaptiveConfig{InitBatch: 8})
		if err != nil {
			t.Fatal(err)
		}
		if p.unmarshal(b) == nil {
			roundTrip(t, "adaptive batch", p.marshal, p.unmarshal)
		}
	})
}

func roundTrip(t *testing.T, what string, marshal func() ([]byte, error), unmarshal func([]byte) error) {
	t.Helper()
	once, err := marshal()
	if err != nil {
		t.Fatalf("%s: an accepted state does not encode: %v", what, err)
	}
	if err := unmarshal(once); err != nil {
		t.Fatalf("%s: %s encodes to something it rejects: %v", what, once, err)
	}
	twice, err := marshal()
	if err != nil || !bytes.Equal(once, twice) {
		t.Fatalf("%s: %s re-encodes to %s (%v)", what, once, twice, err)
	}
}
