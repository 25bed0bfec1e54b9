package testhosts

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Link is the capacity of a host's link to the switch, as a network card
// of that speed: what the host sends and what is sent to it each pass a
// token bucket filter (the kernel's tbf qdisc, on the host's eth0 and on
// the switch's end of the link), so each direction carries at most Rate.
// Without one a link runs at memory speed.
type Link struct {
	// Rate is the link's speed in bits per second, each way; 0 leaves the
	// link unshaped.
	Rate int64
	// Burst is how many bytes the bucket holds: after a pause, that much
	// leaves at memory speed before the rate holds it back. Default: 1 ms
	// at Rate, at least 64 KiB (tbf needs room for a few full-size packets,
	// and at least what the rate earns in one timer tick).
	Burst int
	// Latency is the longest a packet may wait in the link's queue; one
	// that would wait longer is dropped, as a full switch buffer drops it.
	// Default 20 ms.
	Latency time.Duration
}

const (
	minBurst       = 64 << 10
	defaultLatency = 20 * time.Millisecond
)

// withDefaults fills Burst and Latency and validates the rest.
func (l Link) withDefaults() (Link, error) {
	if l.Rate < 0 || l.Burst < 0 || l.Latency < 0 {
		return l, fmt.Errorf("testhosts: link %+v: negative values", l)
	}
	if l.Rate == 0 {
		return Link{}, nil
	}
	if l.Rate < 8<<10 {
		return l, fmt.Errorf("testhosts: link rate %d bit/s below 8 kbit/s", l.Rate)
	}
	if l.Burst == 0 {
		l.Burst = max(int(l.Rate/8/1000), minBurst)
	}
	if l.Latency == 0 {
		l.Latency = defaultLatency
	}
	return l, nil
}

// CanShape reports why links cannot be shaped here (nil if they can).
func CanShape() error {
	if _, err := exec.LookPath("tc"); err != nil {
		return fmt.Errorf("%w: tc not found (apt-get install iproute2)", ErrUnavailable)
	}
	return nil
}

// Shape sets the host's link (the zero Link removes the shaping).
func (h *Host) Shape(l Link) error {
	l, err := l.withDefaults()
	if err != nil {
		return err
	}
	if err := CanShape(); err != nil {
		if l.Rate == 0 {
			return nil // nothing can have been applied
		}
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.removed {
		return fmt.Errorf("testhosts: %s was removed", h.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The host's sending side, then the switch's side towards the host.
	for _, end := range [][2]string{{h.ns, "eth0"}, {h.net.sw, "v" + strconv.Itoa(h.index)}} {
		if err := shapeDev(ctx, end[0], end[1], l); err != nil {
			return fmt.Errorf("testhosts: shaping %s's link: %w", h.Name, err)
		}
	}
	h.link = l
	return nil
}

// Link returns the host's link as Shape last set it (with its defaults).
func (h *Host) Link() Link {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.link
}

// shapeDev puts a tbf qdisc of l on device dev of namespace ns, or removes
// the root qdisc when l has no rate.
func shapeDev(ctx context.Context, ns, dev string, l Link) error {
	if l.Rate == 0 {
		out, err := exec.CommandContext(ctx, "tc", "-n", ns, "qdisc", "del", "dev", dev, "root").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") && !strings.Contains(string(out), "Cannot delete qdisc with handle of zero") {
			return fmt.Errorf("tc qdisc del dev %s: %v: %s", dev, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	args := []string{"-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", strconv.FormatInt(l.Rate, 10) + "bit",
		"burst", strconv.Itoa(l.Burst),
		"latency", strconv.FormatInt(l.Latency.Microseconds(), 10) + "us"}
	if out, err := exec.CommandContext(ctx, "tc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
