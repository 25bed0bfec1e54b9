package hosts

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Change is what changed among the usable hosts.
type Change struct {
	// Hosts are the usable hosts after the change, in assignment order: the
	// oldest first (a job fills them in this order, so ranks stay on the
	// hosts they were on), blacklisted hosts left out.
	Hosts []Host
	// Added are hosts that became usable: newly discovered, or back from a
	// blacklist cooldown.
	Added []Host
	// Removed are hosts no longer usable: gone from discovery, or
	// blacklisted. Their workers should go.
	Removed []Host
	// Resized are usable hosts whose slot count changed (with the new count).
	Resized []Host
	// Err is a failed discovery; the hosts are unchanged (the last answer
	// stands until the next one).
	Err error
}

// Empty reports whether nothing changed.
func (c Change) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Resized) == 0 && c.Err == nil
}

func (c Change) String() string {
	if c.Err != nil {
		return "discovery failed: " + c.Err.Error()
	}
	return fmt.Sprintf("hosts %s (added %s, removed %s, resized %s)", Format(c.Hosts), Format(c.Added), Format(c.Removed), Format(c.Resized))
}

// Cooldown is Horovod's --blacklist-cooldown-range: a blacklisted host is
// usable again after a cooldown of about Min·2^k (k: how often it was
// blacklisted) plus up to Min of random spread, clamped to [Min, Max].
// The zero Cooldown blacklists for good, as Horovod does without a range.
type Cooldown struct {
	Min, Max time.Duration
}

// Horovod's bounds on the range (1 s and 1 h).
const (
	MinCooldown = time.Second
	MaxCooldown = time.Hour
)

// Check says what is wrong with the range, if anything.
func (c Cooldown) Check() error {
	if c == (Cooldown{}) {
		return nil
	}
	if c.Min < MinCooldown || c.Max > MaxCooldown || c.Min > c.Max {
		return fmt.Errorf("blacklist cooldown range %v..%v: want %v ≤ min ≤ max ≤ %v", c.Min, c.Max, MinCooldown, MaxCooldown)
	}
	return nil
}

// Set tracks the hosts a job may use: what discovery reports, minus the
// blacklisted hosts still in their cooldown. It is a plain state machine
// (the caller passes the time); Watch drives it from a Discovery.
type Set struct {
	cooldown Cooldown
	jitter   func() float64 // in [0, 1)

	discovered map[string]int // name -> slots, as last reported
	order      []string       // usable hosts, oldest first
	black      map[string]*blacklisting
}

// blacklisting is a host's record: how often it was blacklisted, and whether
// it is now, until when.
type blacklisting struct {
	count  int
	active bool
	until  time.Time // zero while active: for good
}

// NewSet returns an empty Set with that cooldown (checked by Check).
func NewSet(c Cooldown) (*Set, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	return &Set{cooldown: c, jitter: rand.Float64, discovered: map[string]int{}, black: map[string]*blacklisting{}}, nil
}

// Hosts returns the usable hosts in assignment order.
func (s *Set) Hosts() []Host {
	hs := make([]Host, len(s.order))
	for i, name := range s.order {
		hs[i] = Host{Name: name, Slots: s.discovered[name]}
	}
	return hs
}

// Blacklisted reports whether name is blacklisted at now, and until when (the
// zero time: for good).
func (s *Set) Blacklisted(name string, now time.Time) (bool, time.Time) {
	b, ok := s.black[name]
	if !ok || !b.active || (!b.until.IsZero() && !now.Before(b.until)) {
		return false, time.Time{}
	}
	return true, b.until
}

// Update takes a discovery's answer at now and returns what changed.
func (s *Set) Update(found []Host, now time.Time) Change {
	before := s.Hosts()
	s.discovered = make(map[string]int, len(found))
	for _, h := range found {
		s.discovered[h.Name] = h.Slots
	}
	// Cooldowns that have ended: the host is forgiven (its count stays, so a
	// second blacklisting waits longer).
	for _, b := range s.black {
		if b.active && !b.until.IsZero() && !now.Before(b.until) {
			b.active, b.until = false, time.Time{}
		}
	}
	order := slices.DeleteFunc(slices.Clone(s.order), func(name string) bool {
		_, ok := s.discovered[name]
		return !ok || s.isBlack(name)
	})
	for _, h := range found {
		if !slices.Contains(order, h.Name) && !s.isBlack(h.Name) {
			order = append(order, h.Name)
		}
	}
	s.order = order
	return diff(before, s.Hosts())
}

func (s *Set) isBlack(name string) bool {
	b, ok := s.black[name]
	return ok && b.active
}

// Blacklist takes name out of use (a host whose workers failed or could not
// be started), for the cooldown or for good, and returns what changed and
// until when (zero: for good). A host blacklisted again during its cooldown
// keeps that cooldown, as in Horovod.
func (s *Set) Blacklist(name string, now time.Time) (Change, time.Time) {
	b, ok := s.black[name]
	if !ok {
		b = &blacklisting{}
		s.black[name] = b
	}
	if b.active && (b.until.IsZero() || now.Before(b.until)) {
		return Change{Hosts: s.Hosts()}, b.until
	}
	before := s.Hosts()
	b.count++
	b.active, b.until = true, time.Time{}
	if s.cooldown != (Cooldown{}) {
		// Horovod's rule: min·2^count + U(0,1)·min, clamped to [min, max].
		d := float64(s.cooldown.Min)*float64(uint64(1)<<min(b.count, 40)) + s.jitter()*float64(s.cooldown.Min)
		b.until = now.Add(time.Duration(max(float64(s.cooldown.Min), min(float64(s.cooldown.Max), d))))
	}
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return n == name })
	return diff(before, s.Hosts()), b.until
}

// diff compares two host lists.
func diff(before, after []Host) Change {
	c := Change{Hosts: after}
	old := map[string]int{}
	for _, h := range before {
		old[h.Name] = h.Slots
	}
	now := map[string]bool{}
	for _, h := range after {
		now[h.Name] = true
		switch slots, ok := old[h.Name]; {
		case !ok:
			c.Added = append(c.Added, h)
		case slots != h.Slots:
			c.Resized = append(c.Resized, h)
		}
	}
	for _, h := range before {
		if !now[h.Name] {
			c.Removed = append(c.Removed, h)
		}
	}
	return c
}
