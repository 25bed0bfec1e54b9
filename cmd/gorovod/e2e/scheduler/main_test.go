package scheduler

import (
	"os"
	"testing"

	"github.com/gorovod/gorovod/cmd/gorovod/e2e"
)

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(schedulerProcessEnv); ok {
		// Not the tests: the scheduler process of TestSchedulerWorkloadOnKubelets.
		os.Exit(runSchedulerProcess(spec))
	}
	os.Exit(e2e.Main(m))
}
