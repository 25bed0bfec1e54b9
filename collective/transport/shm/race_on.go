//go:build race

package shm

import "sync/atomic"

// The race detector does not see the ordering that the rings' counters give,
// since they live in shared memory outside the Go heap; without help it
// reports the copies of one goroutine into a ring and of another out of it as
// races whenever both sides of a link run in one process (the tests). As
// internal/poll does for file descriptors, a release before each counter is
// published and an acquire after each is read make that ordering visible. This
// variable exists only in race builds and orders nothing else.
var raceSync atomic.Uint64

func raceRelease() { raceSync.Add(1) }
func raceAcquire() { raceSync.Load() }
