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

// TestAlgorithmsLikeEnv: a worker that joins its launcher's job takes the
// algorithms the environment forces, unless its own configuration forces one.
func TestAlgorithmsLikeEnv(t *testing.T) {
	env := collective.DefaultConfig()
	env.Algorithm, env.AllgatherAlgorithm = collective.AlgorithmHierarchical, collective.AlgorithmHierarchical
	cfg := collective.DefaultConfig()
	cfg.AllgatherAlgorithm = collective.AlgorithmRing
	algorithmsLikeEnv(&cfg, env)
	if cfg.Algorithm != collective.AlgorithmHierarchical || cfg.AllgatherAlgorithm != collective.AlgorithmRing {
		t.Errorf("got %q %q, want hierarchical (from the environment) and ring (the program's)", cfg.Algorithm, cfg.AllgatherAlgorithm)
	}
	cfg = collective.Config{}
	algorithmsLikeEnv(&cfg, collective.DefaultConfig())
	if cfg.Algorithm != collective.AlgorithmAuto {
		t.Errorf("nothing forced: got %q", cfg.Algorithm)
	}
}
