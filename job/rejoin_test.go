package job

import (
	"strings"
	"testing"
)

// Rule 6 for one process: its exclusions and returns as worlds leave it out
// and admit it again, and the state its exit then counts as.
func TestPresence(t *testing.T) {
	for _, tc := range []struct {
		name         string
		worlds       []string // "in" (admitted), "out:NAME" (a world without NAME), "leave:NAME" (NAME announced leaving)
		exit         WorkerState
		trainingOver bool
		want         WorkerState
		excluded     int
		rejoined     int
	}{
		{"left out, then exits 0", []string{"in", "out:a"}, Finished, false, Excluded, 1, 0},
		{"left out and back as a new member", []string{"in", "out:a", "in"}, Finished, true, Finished, 1, 1},
		{"left out of two worlds counts once", []string{"in", "out:a", "out:a"}, Finished, false, Excluded, 1, 0},
		{"leaving on its own is not left out", []string{"in", "leave:a", "out:a"}, Finished, true, Finished, 0, 0},
		{"back, then leaving under its new name", []string{"in", "out:a", "in", "leave:b", "out:b"}, Finished, true, Finished, 1, 1},
		{"back, then left out again", []string{"in", "out:a", "in", "out:b"}, Finished, false, Excluded, 2, 1},
		{"never admitted, exits 0 after the end", nil, Finished, true, Stopped, 0, 0},
		{"never admitted, exits 0 before the end", nil, Finished, false, Finished, 0, 0},
		{"left out and killed stays lost", []string{"in", "out:a"}, Lost, false, Lost, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s presence
			excluded, rejoined := 0, 0
			for _, w := range tc.worlds {
				what, name, _ := strings.Cut(w, ":")
				switch what {
				case "in":
					if s.admitted() {
						rejoined++
					}
				case "out":
					if s.leftOut(name) {
						excluded++
					}
				case "leave":
					s.announceLeaving(name)
				}
			}
			if got := s.final(tc.exit, tc.trainingOver); got != tc.want || excluded != tc.excluded || rejoined != tc.rejoined {
				t.Fatalf("%v, excluded %d, rejoined %d; want %v, %d, %d", got, excluded, rejoined, tc.want, tc.excluded, tc.rejoined)
			}
		})
	}
}
