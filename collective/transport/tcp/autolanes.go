package tcp

import (
	"time"

	"golang.org/x/sys/unix"
)

// Choosing a link's lanes (Config.Lanes 0 between hosts): the link opens
// autoLanes connections, and the sending side of each direction decides
// how many of them carry its data frames. It starts with one and measures
// the rate the link delivers at each count: over a stretch of its large
// frames (those that could be striped), the bytes the peer acknowledged
// (the bytes sent less what the lanes' send queues grew by: SIOCOUTQ)
// over the time they took, leaving out the pauses between frames longer
// than autoIdleGap (when the sender computes rather than sends): the
// measurement is made of the stretches between such pauses, each from the
// end of its first frame to the end of its last.
// Counting what was acknowledged rather than what Send took matters:
// each lane's socket buffer takes megabytes at memory speed before a Send
// has to wait, and lanes taken into use bring empty ones, which made a
// link seem faster with every lane added. The first warm bytes after each
// change (acknowledged, not only sent) are not measured either, as the
// new lanes' congestion windows grow. The sender doubles the count (1, 2, 4, … up to the lanes the link
// has) while the rate rises by at least laneGain, and keeps the best count
// for the rest of the link's life.
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
	// autoIdleGap is the longest pause between two large frames that
	// counts as sending time: the steps of a collective follow each other
	// within a few milliseconds, while a pause for computing lasts longer.
	autoIdleGap = 20 * time.Millisecond
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
	// idleGap is the longest pause between frames that counts as sending
	// time (autoIdleGap).
	idleGap time.Duration
	// queued is how many bytes the link's lanes hold that the peer has
	// not acknowledged yet.
	queued func() int64

	best     int     // the best count measured so far (0: none yet)
	bestRate float64 // its rate, bytes per second
	settled  bool

	seen      int64 // bytes sent at cur before measuring
	warmQueue int64 // queued() before the first of them
	measuring bool  // past the warm bytes
	// The measurement: the bytes acknowledged and the time taken over
	// the stretches measured so far, and the one under way: its start,
	// queued() then, the bytes sent since and queued() after the last.
	acked    int64
	took     time.Duration
	segStart time.Time
	segQueue int64
	segSent  int64
	lastQ    int64
	lastEnd  time.Time // when the last frame's Send returned

	// rates holds the rate measured at each count tried, by count, for
	// the link's log line once it settles.
	rates [MaxLanes + 1]float64
}

func newLaneChooser(lanes int, warm, trial int64, queued func() int64) laneChooser {
	c := laneChooser{max: lanes, cur: 1, warm: warm, trial: trial, idleGap: autoIdleGap, queued: queued}
	if lanes <= 1 {
		c.settled = true
	}
	return c
}

// lanes is the count the next frame uses.
func (c *laneChooser) lanes() int { return c.cur }

// observe records a frame of n bytes sent at the current count, its Send
// called at start and returned at end, and moves to the next count once
// that one is measured. It reports whether the choice settled with this
// frame.
func (c *laneChooser) observe(n int, start, end time.Time) bool {
	if c.settled {
		return false
	}
	gap := start.Sub(c.lastEnd)
	if !c.measuring {
		c.lastEnd = end
		q := c.queued()
		if c.seen == 0 {
			c.warmQueue = q - int64(n)
		}
		c.seen += int64(n)
		if c.seen-(q-c.warmQueue) >= c.warm {
			c.measuring, c.acked, c.took = true, 0, 0
			c.startStretch(end)
		}
		return false
	}
	if gap > c.idleGap {
		// A pause: close the stretch at the frame before it, and start
		// another after this frame.
		c.closeStretch()
		c.lastEnd = end
		c.startStretch(end)
		return false
	}
	c.lastEnd = end
	c.segSent += int64(n)
	c.lastQ = c.queued()
	if c.acked+c.segSent < c.trial {
		return false
	}
	c.closeStretch()
	rate := float64(c.acked) / max(c.took.Seconds(), 1e-9)
	c.rates[c.cur] = rate
	c.seen, c.measuring = 0, false
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

func (c *laneChooser) startStretch(at time.Time) {
	c.segStart, c.segQueue, c.segSent = at, c.queued(), 0
	c.lastQ = c.segQueue
}

// closeStretch adds the stretch under way, up to the last frame's end, to
// the measurement: what was sent less what the queues grew by.
func (c *laneChooser) closeStretch() {
	if c.segSent == 0 {
		return
	}
	c.acked += max(c.segSent-(c.lastQ-c.segQueue), 0)
	c.took += c.lastEnd.Sub(c.segStart)
	c.segSent = 0
}

// unacked is how many bytes the link's lanes hold that the peer has not
// acknowledged: sent and in flight, or not sent yet (SIOCOUTQ). A lane
// whose queue cannot be read counts as empty.
func (l *lanedLink) unacked() int64 {
	var total int64
	for k, ln := range l.lanes {
		if ln.rc.Control(l.outqOf[k]) == nil {
			total += int64(l.outq[k])
		}
	}
	return total
}

// readQueues prepares the calls unacked makes, one per lane, so that
// measuring allocates nothing.
func (l *lanedLink) readQueues() {
	l.outq = make([]int, len(l.lanes))
	l.outqOf = make([]func(uintptr), len(l.lanes))
	for k := range l.lanes {
		l.outqOf[k] = func(fd uintptr) {
			n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
			if err != nil {
				n = 0
			}
			l.outq[k] = n
		}
	}
}
