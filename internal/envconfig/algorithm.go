package envconfig

import (
	"fmt"
	"strings"
)

// The variables that force the collective algorithms of a worker (see
// collective.Config.Algorithm), and Horovod's switches, which map onto
// them: HOROVOD_HIERARCHICAL_ALLREDUCE=1 is
// GOROVOD_ALLREDUCE_ALGORITHM=hierarchical, =0 is ring; likewise for
// allgather. The GOROVOD_ variables win when both are set.
const (
	EnvAllreduceAlgorithm           = "GOROVOD_ALLREDUCE_ALGORITHM"
	EnvAllgatherAlgorithm           = "GOROVOD_ALLGATHER_ALGORITHM"
	EnvHorovodHierarchicalAllreduce = "HOROVOD_HIERARCHICAL_ALLREDUCE"
	EnvHorovodHierarchicalAllgather = "HOROVOD_HIERARCHICAL_ALLGATHER"
)

// Algorithms is what the environment forces: algorithm names as
// collective.ParseAlgorithm reads them ("" where nothing is forced).
type Algorithms struct {
	Allreduce, Allgather string
}

// LoadAlgorithms reads Algorithms through getenv.
func LoadAlgorithms(getenv func(string) string) (Algorithms, error) {
	var a Algorithms
	var err error
	if a.Allreduce, err = algorithmVar(getenv, EnvAllreduceAlgorithm, EnvHorovodHierarchicalAllreduce); err != nil {
		return a, err
	}
	a.Allgather, err = algorithmVar(getenv, EnvAllgatherAlgorithm, EnvHorovodHierarchicalAllgather)
	return a, err
}

// algorithmVar is the algorithm the variable name forces, or, when it is
// unset, the one Horovod's boolean switch horovod does.
func algorithmVar(getenv func(string) string, name, horovod string) (string, error) {
	if v := strings.TrimSpace(getenv(name)); v != "" {
		return v, nil
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv(horovod))); v {
	case "":
		return "", nil
	case "1", "true", "yes", "on":
		return "hierarchical", nil
	case "0", "false", "no", "off":
		return "ring", nil
	default:
		return "", fmt.Errorf("%s=%q: want 1 or 0", horovod, v)
	}
}
