// Package e2e is what gorovod's end-to-end tests share: the programs they
// run (the gorovod command built with -race, the example trainers, a
// launcher with a Go heuristic; Main builds them once per test binary), and
// the helpers that start jobs as a user would (StartRunJob, HostJob, the
// Kubernetes installs), follow what the launcher prints (RunJobHarness,
// TrainerLine) and check it (CheckElasticInvariantsSteps, Disagreement).
//
// The tests are in cmd/gorovod (the launcher on one machine, Slurm) and in
// the packages below this one, one per kind of cluster: hosts (several hosts
// as network namespaces, reached over ssh), kube (`gorovod run --kubernetes`
// and GorovodJobs on a real kubelet) and scheduler (the scheduler service
// and its drivers on two real kubelets). Each package is a test binary of
// its own, so `go test ./...` runs them side by side, each within its own
// -timeout. Nothing outside those tests imports this package.
package e2e
