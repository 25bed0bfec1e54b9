// Package hosts is gorovod's end-to-end tests across hosts: `gorovod run`
// starting its workers over ssh on network-namespaced hosts
// (internal/testing/testhosts), with hosts killed, partitioned, silenced and
// paused, and the measurements of world changes at 4 to 16 workers
// (TestMeasureHostTransitions and TestTransitionBreakdown, which run with
// GOROVOD_MEASURE_TRANSITIONS=1). It holds tests only; their helpers are in
// cmd/gorovod/e2e.
package hosts
