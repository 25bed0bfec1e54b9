package sync

import (
	"testing"

	"github.com/gorovod/gorovod/collective/transport"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// TestWorkerConfigFromEnvSecurity: GOROVOD_DATA_SECURITY, which `gorovod run
// --security` / --encrypt sets, reaches the worker's transport
// configuration, and an unknown setting is refused.
func TestWorkerConfigFromEnvSecurity(t *testing.T) {
	for k, v := range map[string]string{
		envconfig.EnvJobID: "job-s", envconfig.EnvSecret: "00112233445566778899aabbccddeeff", envconfig.EnvSeeds: "127.0.0.1:1",
	} {
		t.Setenv(k, v)
	}
	for _, tc := range []struct {
		value string
		want  transport.Security
		bad   bool
	}{
		{"", transport.SecurityDefault, false},
		{"encrypted", transport.SecurityEncrypted, false},
		{"plain", transport.SecurityPlain, false},
		{"rot13", 0, true},
	} {
		t.Setenv(envconfig.EnvDataSecurity, tc.value)
		cfg, err := WorkerConfigFromEnv()
		if (err != nil) != tc.bad || (!tc.bad && cfg.Transport.Security != tc.want) {
			t.Errorf("%s=%q: security %v, error %v; want %v (error: %v)", envconfig.EnvDataSecurity, tc.value, cfg.Transport.Security, err, tc.want, tc.bad)
		}
	}
}

// TestWorkerConfigFromEnvLanes: GOROVOD_TCP_LANES, which `gorovod run
// --lanes` sets, reaches the worker's TCP configuration, and a count out of
// range is refused.
func TestWorkerConfigFromEnvLanes(t *testing.T) {
	for k, v := range map[string]string{
		envconfig.EnvJobID: "job-l", envconfig.EnvSecret: "00112233445566778899aabbccddeeff", envconfig.EnvSeeds: "127.0.0.1:1",
	} {
		t.Setenv(k, v)
	}
	for _, tc := range []struct {
		value string
		want  int
		bad   bool
	}{
		{"", 0, false},
		{"4", 4, false},
		{"1", 1, false},
		{"17", 0, true},
		{"several", 0, true},
	} {
		t.Setenv(envconfig.EnvTCPLanes, tc.value)
		cfg, err := WorkerConfigFromEnv()
		if (err != nil) != tc.bad || (!tc.bad && cfg.Transport.TCP.Lanes != tc.want) {
			t.Errorf("%s=%q: lanes %d, error %v; want %d (error: %v)", envconfig.EnvTCPLanes, tc.value, cfg.Transport.TCP.Lanes, err, tc.want, tc.bad)
		}
	}
}
