package tcp

import "time"

// Choosing a link's lanes (Config.Lanes 0 between hosts): the link opens
// autoLanes connections, and the sending side of each direction decides
// how many of them carry its data frames. It starts with one and measures
// the rate each count achieves on the link's large frames: the bytes of
// the frames that could be striped, over the time their Send calls took
// (from the call until every lane's part is in the kernel), so the time
// between frames, when the sender computes or waits for its peer, does
// not count. Once a link is busy its socket buffers are full and a Send
// returns only as fast as the path drains them, so this is the rate of
// the path at that count: the link, the receiver, or the cores that copy
// and seal. The first warm bytes after each change are not measured, as
// the buffers of a lane just taken into use take them at memory speed.
// It then doubles the count (1, 2, 4, … up to the lanes the link has)
// while the rate rises by at least laneGain, and keeps the best count for
// the rest of the link's life.
//
// The receiver learns the count from the sender: a FrameLanes frame on the
// first lane, sent before the first frame that uses a new count, so both
// ends cut every frame the same way.

const (
	// autoLanes is how many connections a link to another host opens
	// when Config.Lanes is 0: four lanes let one link use four cores'
	// worth of the kernel's work and four congestion windows, which
	// reaches a fast NIC's rate where one stream does not.
	autoLanes = 4
	// autoWarmBytes is how much a link sends at a new count before it
	// measures, autoTrialBytes how much it then measures.
	autoWarmBytes  = 4 << 20
	autoTrialBytes = 16 << 20
	// laneGain is the least rise in rate for which a count is worth its
	// lanes: smaller differences are within what a loaded machine's
	// measurements vary by.
	laneGain = 1.10
)

// laneChooser picks how many lanes carry one direction of a link's data
// frames. It is not safe for concurrent use; the link calls it under the
// lock that orders its striped frames.
type laneChooser struct {
	max   int   // lanes of the link
	cur   int   // lanes in use now
	warm  int64 // bytes sent at a new count before measuring
	trial int64 // bytes measured at each count

	best     int     // the best count measured so far (0: none yet)
	bestRate float64 // its rate, bytes per second
	settled  bool

	seen  int64         // bytes sent at cur since it was chosen
	bytes int64         // of which measured
	busy  time.Duration // time in Send of the measured bytes

	// rates holds the rate measured at each count tried, by count, for
	// the link's log line once it settles.
	rates [MaxLanes + 1]float64
}

func newLaneChooser(lanes int, warm, trial int64) laneChooser {
	c := laneChooser{max: lanes, cur: 1, warm: warm, trial: trial}
	if lanes <= 1 {
		c.settled = true
	}
	return c
}

// lanes is the count the next frame uses.
func (c *laneChooser) lanes() int { return c.cur }

// observe records a frame of n bytes whose Send took d at the current
// count, and moves to the next count once that one is measured. It
// reports whether the choice settled with this frame.
func (c *laneChooser) observe(n int, d time.Duration) bool {
	if c.settled {
		return false
	}
	c.seen += int64(n)
	if c.seen <= c.warm {
		return false
	}
	c.bytes += int64(n)
	c.busy += d
	if c.bytes < c.trial {
		return false
	}
	rate := float64(c.bytes) / max(c.busy.Seconds(), 1e-9)
	c.rates[c.cur] = rate
	c.seen, c.bytes, c.busy = 0, 0, 0
	if c.best == 0 || rate >= c.bestRate*laneGain {
		c.best, c.bestRate = c.cur, rate
		if c.cur < c.max {
			c.cur = min(2*c.cur, c.max)
			return false
		}
	}
	c.cur, c.settled = c.best, true
	return true
}
