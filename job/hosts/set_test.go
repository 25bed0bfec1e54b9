package hosts

import (
	"testing"
	"time"
)

func mustList(t *testing.T, s string) []Host {
	t.Helper()
	if s == "" {
		return nil
	}
	hs, err := ParseList(s)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// TestSetFollowsDiscovery: hosts appear in discovery order after those
// already in use, disappear, and change their slots.
func TestSetFollowsDiscovery(t *testing.T) {
	s, err := NewSet(Cooldown{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	steps := []struct {
		found                          string
		hosts, added, removed, resized string
	}{
		{"h1:2,h2:2", "h1:2,h2:2", "h1:2,h2:2", "", ""},
		{"h2:2,h1:2", "h1:2,h2:2", "", "", ""}, // the order is the job's, not the script's
		{"h3:1,h1:2,h2:2", "h1:2,h2:2,h3:1", "h3:1", "", ""},
		{"h3:1,h2:4", "h2:4,h3:1", "", "h1:2", "h2:4"},
		{"h1:2,h3:1,h2:4", "h2:4,h3:1,h1:2", "h1:2", "", ""}, // back, but now the youngest
		{"", "", "", "h2:4,h3:1,h1:2", ""},
	}
	for i, st := range steps {
		c := s.Update(mustList(t, st.found), now)
		if Format(c.Hosts) != st.hosts || Format(c.Added) != st.added || Format(c.Removed) != st.removed || Format(c.Resized) != st.resized {
			t.Errorf("step %d (%s): %v; want hosts %s added %s removed %s resized %s", i, st.found, c, st.hosts, st.added, st.removed, st.resized)
		}
	}
}

// TestBlacklistForGood: without a cooldown range, a blacklisted host never
// comes back, whatever discovery says.
func TestBlacklistForGood(t *testing.T) {
	s, _ := NewSet(Cooldown{})
	now := time.Unix(1000, 0)
	s.Update(mustList(t, "h1:2,h2:2"), now)
	c, until := s.Blacklist("h1", now)
	if Format(c.Removed) != "h1:2" || Format(c.Hosts) != "h2:2" || !until.IsZero() {
		t.Fatalf("blacklisting h1: %v until %v", c, until)
	}
	for _, later := range []time.Duration{time.Second, time.Hour, 1000 * time.Hour} {
		if c := s.Update(mustList(t, "h1:2,h2:2"), now.Add(later)); !c.Empty() || Format(c.Hosts) != "h2:2" {
			t.Errorf("after %v: %v", later, c)
		}
	}
	if black, _ := s.Blacklisted("h1", now.Add(1000*time.Hour)); !black {
		t.Error("h1 no longer blacklisted")
	}
	if c, _ := s.Blacklist("h1", now); !c.Empty() {
		t.Errorf("blacklisting again changed %v", c)
	}
}

// TestBlacklistCooldown: Horovod's rule, min·2^k + U·min clamped to
// [min, max]; a host back from its cooldown is added again (as the
// youngest), and blacklisting it again waits longer.
func TestBlacklistCooldown(t *testing.T) {
	s, err := NewSet(Cooldown{Min: 2 * time.Second, Max: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.jitter = func() float64 { return 0.5 }
	now := time.Unix(1000, 0)
	s.Update(mustList(t, "h1:1,h2:1"), now)
	wants := []time.Duration{5 * time.Second, 9 * time.Second, 17 * time.Second, 20 * time.Second} // 2·2+1, 2·4+1, 2·8+1, clamped
	for k, want := range wants {
		_, until := s.Blacklist("h1", now)
		if got := until.Sub(now); got != want {
			t.Fatalf("blacklisting %d: cooldown %v, want %v", k+1, got, want)
		}
		// During the cooldown: still out, and blacklisting again keeps it.
		if c := s.Update(mustList(t, "h1:1,h2:1"), until.Add(-time.Millisecond)); !c.Empty() {
			t.Fatalf("during the cooldown: %v", c)
		}
		if _, again := s.Blacklist("h1", until.Add(-time.Millisecond)); !again.Equal(until) {
			t.Fatalf("blacklisting during the cooldown moved it to %v", again)
		}
		c := s.Update(mustList(t, "h1:1,h2:1"), until)
		if Format(c.Added) != "h1:1" || Format(c.Hosts) != "h2:1,h1:1" {
			t.Fatalf("after the cooldown: %v", c)
		}
		now = until
	}
	// A host blacklisted while discovery does not list it comes back only
	// when listed again.
	_, until := s.Blacklist("h3", now)
	if c := s.Update(mustList(t, "h1:1,h2:1"), until); !c.Empty() {
		t.Errorf("h3, not discovered, after its cooldown: %v", c)
	}
	if c := s.Update(mustList(t, "h1:1,h2:1,h3:1"), until); Format(c.Added) != "h3:1" {
		t.Errorf("h3 discovered after its cooldown: %v", c)
	}
	for _, bad := range []Cooldown{{Min: 0, Max: time.Second}, {Min: time.Second, Max: 2 * time.Hour}, {Min: 5 * time.Second, Max: time.Second}} {
		if _, err := NewSet(bad); err == nil {
			t.Errorf("cooldown %v accepted", bad)
		}
	}
}
