//go:build race

package epoch_test

// raceEnabled: the race detector slows the simulator about tenfold, so the
// tests that size themselves (TestScale) run smaller under it.
const raceEnabled = true
