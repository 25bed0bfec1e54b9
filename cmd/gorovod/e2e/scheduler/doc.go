// Package scheduler is gorovod's end-to-end tests of the scheduler service
// (`gorovod scheduler`) on two real kubelets: jobs submitted at different
// times sharing the nodes and resized live, a node drained, the scheduler
// and a job's driver restarted, node selectors, slot kinds and preferences,
// and the opt-in workload of TestSchedulerWorkloadOnKubelets. It holds tests
// only; their helpers are in cmd/gorovod/e2e.
package scheduler
