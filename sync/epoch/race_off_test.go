//go:build !race

package epoch_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
