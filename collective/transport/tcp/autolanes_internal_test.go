package tcp

import (
	"slices"
	"testing"
	"time"
)

// TestLaneChooser: the sender starts on one lane, doubles the count while
// the measured rate rises by laneGain, and keeps the best; the bytes sent
// right after a change, which new lanes' empty buffers take at memory
// speed, are not measured.
func TestLaneChooser(t *testing.T) {
	const (
		frame = 256 << 10
		warm  = 2 << 20
		trial = 4 << 20
	)
	for _, tc := range []struct {
		name  string
		max   int
		rate  map[int]float64 // MB/s the path moves at each count
		tried []int
		want  int
	}{
		{"one connection fills the link", 4, map[int]float64{1: 120, 2: 121, 4: 119}, []int{1, 2}, 1},
		{"each connection bound on its own", 4, map[int]float64{1: 100, 2: 200, 4: 400}, []int{1, 2, 4}, 4},
		{"two connections fill the link", 4, map[int]float64{1: 100, 2: 180, 4: 190}, []int{1, 2, 4}, 2},
		{"a gain under laneGain", 4, map[int]float64{1: 100, 2: 109}, []int{1, 2}, 1},
		{"more lanes cost", 4, map[int]float64{1: 100, 2: 60}, []int{1, 2}, 1},
		{"three lanes", 3, map[int]float64{1: 100, 2: 200, 3: 300}, []int{1, 2, 3}, 3},
		{"sixteen lanes", 16, map[int]float64{1: 10, 2: 20, 4: 40, 8: 80, 16: 160}, []int{1, 2, 4, 8, 16}, 16},
		{"one lane only", 1, map[int]float64{1: 100}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newLaneChooser(tc.max, warm, trial)
			var tried []int
			seen := 0 // bytes sent at the current count
			for i := 0; i < 1000 && !c.settled; i++ {
				n := c.lanes()
				if seen == 0 {
					tried = append(tried, n)
				}
				d := time.Duration(float64(frame) / (tc.rate[n] * 1e6) * float64(time.Second))
				if n > 1 && seen < warm {
					// The new lanes' buffers are empty: the frame is
					// taken at once.
					d = time.Microsecond
				}
				seen += frame
				c.observe(frame, d)
				if c.lanes() != n || c.settled {
					seen = 0
				}
			}
			if !c.settled {
				t.Fatal("did not settle")
			}
			if got := c.lanes(); got != tc.want {
				t.Errorf("settled at %d lanes, want %d (rates %v)", got, tc.want, c.rates)
			}
			if !slices.Equal(tried, tc.tried) {
				t.Errorf("tried %v, want %v", tried, tc.tried)
			}
			for _, n := range tc.tried {
				if got, want := c.rates[n]/1e6, tc.rate[n]; got < want*0.99 || got > want*1.01 {
					t.Errorf("measured %.1f MB/s at %d lanes, want %.1f", got, n, want)
				}
			}
			// Settled, it stays.
			for range 100 {
				c.observe(frame, time.Nanosecond)
			}
			if got := c.lanes(); got != tc.want {
				t.Errorf("after settling, moved to %d lanes", got)
			}
		})
	}
}
