package sync

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/sync/epoch"
	"github.com/gorovod/gorovod/sync/fusion"
)

// A zero field means its default, and a field the caller sets is kept even
// when the others are zero (a FusionBytes beside a zero collective
// configuration used to be dropped).
func TestConfigZeroFieldsAreDefaults(t *testing.T) {
	self := epoch.Member{Name: "w", Addr: "127.0.0.1:1"}
	c, err := Config{JobID: "j", Self: self, FusionBytes: 4096}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if c.FusionBytes != 4096 || c.RecoveryTimeout != d.RecoveryTimeout || c.StatsEvery != d.StatsEvery ||
		c.Collective.ChunkBytes != d.Collective.ChunkBytes || c.Logger == nil {
		t.Fatalf("Config{FusionBytes: 4096} means %+v", c)
	}
	if c, _ := (Config{JobID: "j", Self: self}).withDefaults(); c.FusionBytes != fusion.DefaultBytes {
		t.Fatalf("zero FusionBytes means %d", c.FusionBytes)
	}
	for _, bad := range []Config{
		{Self: self},
		{JobID: "j"},
		{JobID: "j", Self: self, FusionBytes: -1},
		{JobID: "j", Self: self, Collective: collective.Config{ChunkBytes: 1}},
	} {
		if _, err := bad.withDefaults(); !errors.Is(err, ErrInvalidConfig) && !errors.Is(err, collective.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want an invalid configuration", bad, err)
		}
	}
	if _, err := openSession(context.Background(), Config{}, nil, nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("openSession with a zero Config: %v", err)
	}
}

func TestWorkerConfigDefaults(t *testing.T) {
	if got := DefaultWorkerConfig().Transport.IOTimeout; got != WorkerIOTimeout {
		t.Fatalf("DefaultWorkerConfig's I/O timeout %v, want %v", got, WorkerIOTimeout)
	}
	c, err := WorkerConfig{JobID: "j", Secret: []byte("s")}.withDefaults()
	if err != nil || c.Transport.IOTimeout != WorkerIOTimeout || c.MinWorkers != 1 || c.Logger == nil {
		t.Fatalf("zero WorkerConfig fields: %+v, %v", c, err)
	}
	c, _ = WorkerConfig{JobID: "j", Secret: []byte("s"), Transport: DefaultWorkerConfig().Transport}.withDefaults()
	c.Transport.IOTimeout = time.Second
	if c, _ := c.withDefaults(); c.Transport.IOTimeout != time.Second {
		t.Fatalf("a chosen I/O timeout became %v", c.Transport.IOTimeout)
	}
	if _, err := StartWorker(context.Background(), WorkerConfig{Secret: []byte("s")}, NewState()); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("StartWorker without a job id: %v", err)
	}
	if _, err := StartWorker(context.Background(), WorkerConfig{JobID: "j", Secret: []byte("s"), MinWorkers: -1}, NewState()); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("StartWorker with a negative minimum: %v", err)
	}
}
