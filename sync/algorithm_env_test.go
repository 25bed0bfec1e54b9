package sync

import (
	"errors"
	"testing"

	"github.com/gorovod/gorovod/collective"
	"github.com/gorovod/gorovod/internal/envconfig"
)

// TestAlgorithmsFromEnv: the environment forces the collective algorithms,
// Horovod's switches included, and bad names are refused.
func TestAlgorithmsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env                  map[string]string
		allreduce, allgather collective.Algorithm
		bad                  bool
	}{
		{env: nil, allreduce: collective.AlgorithmAuto, allgather: collective.AlgorithmAuto},
		{env: map[string]string{envconfig.EnvHorovodHierarchicalAllreduce: "1", envconfig.EnvHorovodHierarchicalAllgather: "1"},
			allreduce: collective.AlgorithmHierarchical, allgather: collective.AlgorithmHierarchical},
		{env: map[string]string{envconfig.EnvAllreduceAlgorithm: "rd"}, allreduce: collective.AlgorithmRecursiveDoubling, allgather: collective.AlgorithmAuto},
		{env: map[string]string{envconfig.EnvAllreduceAlgorithm: "fastest"}, bad: true},
		{env: map[string]string{envconfig.EnvAllgatherAlgorithm: "rd"}, bad: true},
	} {
		cfg := collective.DefaultConfig()
		err := algorithmsFromEnv(&cfg, func(k string) string { return tc.env[k] })
		if tc.bad {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%v: error %v, want ErrInvalidConfig", tc.env, err)
			}
			continue
		}
		if err != nil || cfg.Algorithm != tc.allreduce || cfg.AllgatherAlgorithm != tc.allgather {
			t.Errorf("%v: %q %q %v, want %q %q", tc.env, cfg.Algorithm, cfg.AllgatherAlgorithm, err, tc.allreduce, tc.allgather)
		}
	}
}
