package sync

import (
	"context"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorovod/gorovod/internal/envconfig"
)

// TestWorkerConfigFromEnvMinWorkers: the job's minimum a launcher hands its
// workers (GOROVOD_MIN_WORKERS) becomes WorkerConfig.MinWorkers, what the
// worker requires of a world should it take over proposing; unset, it is 1.
// The job's first workers (GOROVOD_NP) become WorkerConfig.FirstWorld;
// unset, 0 (not known). A bad value is an error.
func TestWorkerConfigFromEnvMinWorkers(t *testing.T) {
	for _, tc := range []struct {
		val     string
		want    int
		wantNP  int // GOROVOD_NP set to val as well
		wantErr bool
	}{
		{val: "", want: 1, wantNP: 0},
		{val: "1", want: 1, wantNP: 1},
		{val: "4", want: 4, wantNP: 4},
		{val: "0", wantErr: true},
		{val: "-1", wantErr: true},
		{val: "four", wantErr: true},
	} {
		t.Run(tc.val, func(t *testing.T) {
			t.Setenv(envconfig.EnvJobID, "job-x")
			t.Setenv(envconfig.EnvSecret, "00112233445566778899aabbccddeeff")
			t.Setenv(envconfig.EnvSeeds, "127.0.0.1:1")
			t.Setenv(envconfig.EnvMinWorkers, tc.val)
			t.Setenv(envconfig.EnvFirstWorld, tc.val)
			cfg, err := WorkerConfigFromEnv()
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), envconfig.EnvMinWorkers)):
				t.Fatalf("got MinWorkers %d, %v; want an error naming %s", cfg.MinWorkers, err, envconfig.EnvMinWorkers)
			case !tc.wantErr && (err != nil || cfg.MinWorkers != tc.want):
				t.Fatalf("got MinWorkers %d, %v; want %d", cfg.MinWorkers, err, tc.want)
			case !tc.wantErr && cfg.FirstWorld != tc.wantNP:
				t.Fatalf("got FirstWorld %d; want %d", cfg.FirstWorld, tc.wantNP)
			}
		})
	}
}

// TestJoinTakesTheJobsMinimum: a trainer under a launcher joins with at least
// the job's minimum (GOROVOD_MIN_WORKERS) as the world a takeover may
// propose, and at least the job's first workers (GOROVOD_NP) as the voters
// of a first world it proposes; its own TrainConfig.Worker.MinWorkers and
// FirstWorld may only raise them. It takes the driver's probe timeout
// (GOROVOD_PROBE_TIMEOUT) unless it sets its own. Each
// case joins a real driver over gossip.
// TestWorkerConfigFromEnvProbeTimeout: the driver's probe timeout a launcher
// hands its workers (GOROVOD_PROBE_TIMEOUT) becomes
// WorkerConfig.ProbeTimeout, what the worker's proposer waits for a blamed
// worker should it take over; unset, 0 (the proposer's default). A bad value
// is an error naming the variable.
func TestWorkerConfigFromEnvProbeTimeout(t *testing.T) {
	for _, tc := range []struct {
		val     string
		want    time.Duration
		wantErr bool
	}{
		{val: "", want: 0},
		{val: "3s", want: 3 * time.Second},
		{val: "750ms", want: 750 * time.Millisecond},
		{val: "0s", wantErr: true},
		{val: "-1s", wantErr: true},
		{val: "3", wantErr: true},
	} {
		t.Run(tc.val, func(t *testing.T) {
			t.Setenv(envconfig.EnvJobID, "job-x")
			t.Setenv(envconfig.EnvSecret, "00112233445566778899aabbccddeeff")
			t.Setenv(envconfig.EnvSeeds, "127.0.0.1:1")
			t.Setenv(envconfig.EnvProbeTimeout, tc.val)
			cfg, err := WorkerConfigFromEnv()
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), envconfig.EnvProbeTimeout)):
				t.Fatalf("got ProbeTimeout %v, %v; want an error naming %s", cfg.ProbeTimeout, err, envconfig.EnvProbeTimeout)
			case !tc.wantErr && (err != nil || cfg.ProbeTimeout != tc.want):
				t.Fatalf("got ProbeTimeout %v, %v; want %v", cfg.ProbeTimeout, err, tc.want)
			}
		})
	}
}

func TestJoinTakesTheJobsMinimum(t *testing.T) {
	d := startDriver(t, 1)
	for _, tc := range []struct {
		name         string
		env, trainer int
		want         int
		// The job's first workers (GOROVOD_NP) likewise: np, trainerNP
		// and wantNP.
		np, trainerNP, wantNP int
		// The driver's probe timeout (GOROVOD_PROBE_TIMEOUT) likewise,
		// unless the trainer sets its own: probe, trainerProbe and
		// wantProbe.
		probe, trainerProbe, wantProbe time.Duration
	}{
		{name: "the trainer sets none: the job's", env: 3, trainer: 0, want: 3, np: 4, wantNP: 4, probe: 3 * time.Second, wantProbe: 3 * time.Second},
		{name: "the trainer's default of 1: the job's", env: 3, trainer: 1, want: 3, np: 4, trainerNP: 1, wantNP: 4},
		{name: "the trainer asks more: its own", env: 2, trainer: 5, want: 5, np: 4, trainerNP: 6, wantNP: 6,
			probe: 3 * time.Second, trainerProbe: time.Second, wantProbe: time.Second},
		{name: "no minimum from the launcher: the trainer's", env: 0, trainer: 2, want: 2, np: 0, trainerNP: 3, wantNP: 3},
		{name: "no size from the launcher nor the trainer: not known", env: 2, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envconfig.EnvJobID, "elastic-test")
			t.Setenv(envconfig.EnvSecret, hex.EncodeToString([]byte("elastic-test-secret")))
			t.Setenv(envconfig.EnvSeeds, d.GossipAddr())
			if tc.env > 0 {
				t.Setenv(envconfig.EnvMinWorkers, strconv.Itoa(tc.env))
			} else {
				t.Setenv(envconfig.EnvMinWorkers, "")
			}
			if tc.np > 0 {
				t.Setenv(envconfig.EnvFirstWorld, strconv.Itoa(tc.np))
			} else {
				t.Setenv(envconfig.EnvFirstWorld, "")
			}
			if tc.probe > 0 {
				t.Setenv(envconfig.EnvProbeTimeout, tc.probe.String())
			} else {
				t.Setenv(envconfig.EnvProbeTimeout, "")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st := NewState()
			st.RegisterTensor("x", make([]float32, 4))
			m, err := join(ctx, WorkerConfig{MinWorkers: tc.trainer, FirstWorld: tc.trainerNP, ProbeTimeout: tc.trainerProbe}, st)
			if err != nil {
				t.Fatal(err)
			}
			defer m.close()
			jm, ok := m.(jobMember)
			if !ok {
				t.Fatalf("joined %T, not the launcher's job", m)
			}
			if got := jm.w.cfg.MinWorkers; got != tc.want {
				t.Fatalf("MinWorkers %d, want %d", got, tc.want)
			}
			if got := jm.w.cfg.FirstWorld; got != tc.wantNP {
				t.Fatalf("FirstWorld %d, want %d", got, tc.wantNP)
			}
			if got := jm.w.cfg.ProbeTimeout; got != tc.wantProbe {
				t.Fatalf("ProbeTimeout %v, want %v", got, tc.wantProbe)
			}
		})
	}
}
