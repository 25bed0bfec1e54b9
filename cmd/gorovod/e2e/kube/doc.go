// Package kube is gorovod's end-to-end tests of jobs on Kubernetes: `gorovod
// run --kubernetes` and GorovodJobs run by a real API server, controller
// manager and kubelet (internal/testing/testkube), the workers real pods. It
// holds tests only; their helpers are in cmd/gorovod/e2e.
package kube
