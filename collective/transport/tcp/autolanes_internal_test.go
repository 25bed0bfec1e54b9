package tcp

import (
	"slices"
	"testing"
	"time"
)

// pathModel is a link as a sender sees it: each lane's socket takes bytes
// at once while its buffer (buffer bytes a lane) has room, and the path
// delivers the queued bytes at rate(lanes in use), once it has delivered
// ramp bytes at a new count (until then at the old count's rate, as new
// lanes' congestion windows grow).
type pathModel struct {
	rate   func(lanes int) float64 // bytes per second
	buffer float64                 // per lane
	ramp   int
	now    time.Time
	queue  float64 // sent, not acknowledged

	lanes, prev int
	sinceChange int
}

func (p *pathModel) advance(d time.Duration, lanes int) {
	if lanes != p.lanes {
		p.prev, p.lanes, p.sinceChange = max(p.lanes, 1), lanes, 0
	}
	r := p.rate(lanes)
	if p.sinceChange < p.ramp {
		r = p.rate(p.prev)
	}
	p.now = p.now.Add(d)
	delivered := min(p.queue, r*d.Seconds())
	p.queue -= delivered
	p.sinceChange += int(delivered)
}

// send is one frame's Send: it returns when the frame is in the buffers.
func (p *pathModel) send(n, lanes int) (start, end time.Time) {
	start = p.now
	p.advance(time.Microsecond, lanes) // the copy
	if over := p.queue + float64(n) - p.buffer*float64(lanes); over > 0 {
		p.advance(time.Duration(over/p.rate(lanes)*float64(time.Second)), lanes)
	}
	p.queue += float64(n)
	return start, p.now
}

// TestLaneChooser: the sender starts on one lane, doubles the count while
// the rate the path delivers rises by laneGain, and keeps the best. What
// it measures is what the path delivered, not what the sockets took: the
// lanes taken into use bring empty buffers that take megabytes at once;
// the first bytes at a new count, while new lanes ramp up, are not
// measured; pauses longer than autoIdleGap are left out.
func TestLaneChooser(t *testing.T) {
	const (
		frame  = 256 << 10
		warm   = 2 << 20
		trial  = 8 << 20
		buffer = 4 << 20
	)
	for _, tc := range []struct {
		name  string
		max   int
		rate  map[int]float64 // MB/s the path moves at each count
		pause time.Duration   // every 16th frame, after it
		tried []int
		want  int
	}{
		{"one connection fills the link", 4, map[int]float64{1: 120, 2: 121, 4: 119}, 0, []int{1, 2}, 1},
		{"each connection bound on its own", 4, map[int]float64{1: 100, 2: 200, 4: 400}, 0, []int{1, 2, 4}, 4},
		{"two connections fill the link", 4, map[int]float64{1: 100, 2: 180, 4: 190}, 0, []int{1, 2, 4}, 2},
		{"a gain under laneGain", 4, map[int]float64{1: 100, 2: 107}, 0, []int{1, 2}, 1},
		{"more lanes cost", 4, map[int]float64{1: 100, 2: 60}, 0, []int{1, 2}, 1},
		{"three lanes", 3, map[int]float64{1: 100, 2: 200, 3: 300}, 0, []int{1, 2, 3}, 3},
		{"sixteen lanes", 16, map[int]float64{1: 10, 2: 20, 4: 40, 8: 80, 16: 160}, 0, []int{1, 2, 4, 8, 16}, 16},
		{"one lane only", 1, map[int]float64{1: 100}, 0, nil, 1},
		{"one connection fills the link, pauses", 4, map[int]float64{1: 120, 2: 120, 4: 120}, 500 * time.Millisecond, []int{1, 2}, 1},
		{"each connection bound, pauses", 4, map[int]float64{1: 100, 2: 200, 4: 400}, 500 * time.Millisecond, []int{1, 2, 4}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pathModel{rate: func(n int) float64 { return tc.rate[n] * 1e6 }, buffer: buffer, ramp: warm / 2, now: time.Unix(1, 0)}
			c := newLaneChooser(tc.max, warm, trial, func() int64 { return int64(p.queue) })
			var tried []int
			prev := 0
			for i := 0; i < 10000 && !c.settled; i++ {
				n := c.lanes()
				if n != prev {
					tried = append(tried, n)
					prev = n
				}
				start, end := p.send(frame, n)
				c.observe(frame, start, end)
				// The step between frames, and now and then a pause.
				p.advance(200*time.Microsecond, n)
				if tc.pause > 0 && i%16 == 15 {
					p.advance(tc.pause, n)
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
				if got, want := c.rates[n]/1e6, tc.rate[n]; got < want*0.95 || got > want*1.05 {
					t.Errorf("measured %.1f MB/s at %d lanes, the path delivers %.1f", got, n, want)
				}
			}
			// Settled, it stays.
			for range 100 {
				start, end := p.send(frame, c.lanes())
				c.observe(frame, start, end)
			}
			if got := c.lanes(); got != tc.want {
				t.Errorf("after settling, moved to %d lanes", got)
			}
		})
	}
}
