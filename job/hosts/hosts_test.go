package hosts

import (
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	good := []struct {
		in   string
		want string
	}{
		{"h1:2,h2:2", "h1:2,h2:2"},
		{"h1", "h1:1"},
		{" h1:4 , 198.18.0.2:1 ", "h1:4,198.18.0.2:1"},
		{"[::1]:3,[fe80::1]", "[::1]:3,[fe80::1]:1"},
		{"[fe80::1%eth0]:2", "[fe80::1%eth0]:2"},
		{"node-01.example.com:8,node_2:1", "node-01.example.com:8,node_2:1"},
	}
	for _, g := range good {
		hs, err := ParseList(g.in)
		if err != nil || Format(hs) != g.want {
			t.Errorf("ParseList(%q) = %q, %v; want %q", g.in, Format(hs), err, g.want)
		}
	}
	bad := map[string]string{
		"":                 "empty host list",
		"h1:2,,h2:2":       "empty entry",
		"h1:2,h1:3":        "listed twice",
		"h1:0":             "from 1 to",
		"h1:-1":            "from 1 to",
		"h1:x":             "from 1 to",
		"h1:99999":         "from 1 to",
		"h1:":              "empty slot count",
		"-oProxyCommand:1": "starts with",
		"h 1:2":            "not allowed",
		"h1;rm:2":          "not allowed",
		"[::1":             "IPv6",
		"[1.2.3.4]:2":      "IPv6",
		"[fe80::1%a;b]:2":  "zone",
		"[fe80::1%a b]:2":  "zone",
		"[::1]:":           "empty slot count",
		"a:b:c":            "not allowed",
	}
	for in, want := range bad {
		if _, err := ParseList(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseList(%q) = %v, want an error mentioning %q", in, err, want)
		}
	}
}

func TestParseHostfile(t *testing.T) {
	hs, err := ParseHostfile(strings.NewReader("# the cluster\nh1 slots=4\n\n  h2   slots=2  # fast one\nh3\n[::1] slots=1\n"))
	if err != nil || Format(hs) != "h1:4,h2:2,h3:1,[::1]:1" {
		t.Fatalf("got %q, %v", Format(hs), err)
	}
	bad := map[string]string{
		"":                          "no host",
		"# only a comment\n":        "no host",
		"h1 slots=4\nh1 slots=2\n":  "line 2: host h1 is already on line 1",
		"h1 slots=0\n":              "line 1",
		"h1 slots=4 slots=2\n":      "twice",
		"h1 max_slots=4\n":          `want "host slots=N"`,
		"h1 4\n":                    `want "host slots=N"`,
		"h1 slots=\n":               "from 1 to",
		"\n\n-x slots=1\n":          "line 3",
		"h1 slots=2\nh\x00 slots=1": "line 2",
	}
	for in, want := range bad {
		if _, err := ParseHostfile(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHostfile(%q) = %v, want an error mentioning %q", in, err, want)
		}
	}
	if _, err := ReadHostfile("/nonexistent/hostfile"); err == nil {
		t.Error("missing host file accepted")
	}
}

func TestParseDiscovered(t *testing.T) {
	hs, err := ParseDiscovered([]byte("h1:2\nh2\n\nh1:2\n  h3:1  \n"), 4)
	if err != nil || Format(hs) != "h1:2,h2:4,h3:1" {
		t.Fatalf("got %q, %v", Format(hs), err)
	}
	if hs, err := ParseDiscovered(nil, 1); err != nil || len(hs) != 0 {
		t.Errorf("no output: %v, %v (want no host, no error)", hs, err)
	}
	for in, want := range map[string]string{"h1:2\nh1:3\n": "line 2: host h1 has 3 slots", "h1:2\nbad host\n": "line 2", "h1:0": "line 1"} {
		if _, err := ParseDiscovered([]byte(in), 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDiscovered(%q) = %v, want %q", in, err, want)
		}
	}
}

// The fuzzers: a parser never panics, accepts only valid hosts, and what it
// accepts survives Format and ParseList unchanged.

func checkParsed(t *testing.T, hs []Host) {
	t.Helper()
	seen := map[string]bool{}
	for _, h := range hs {
		if err := CheckName(h.Name); err != nil || h.Slots < 1 || h.Slots > MaxSlots || seen[h.Name] {
			t.Fatalf("accepted %+v (%v, duplicate %v)", h, err, seen[h.Name])
		}
		seen[h.Name] = true
	}
	if len(hs) == 0 {
		return
	}
	again, err := ParseList(Format(hs))
	if err != nil || Format(again) != Format(hs) {
		t.Fatalf("%q does not round-trip: %q, %v", Format(hs), Format(again), err)
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"h1:2,h2:2", "h1", "[::1]:3", "a:b:c", "h1:,", "-x:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hs, err := ParseList(s)
		if err == nil {
			checkParsed(t, hs)
		}
	})
}

func FuzzParseHostfile(f *testing.F) {
	for _, s := range []string{"h1 slots=4\nh2\n", "# c\n\nh1 slots=x", "[::1] slots=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hs, err := ParseHostfile(strings.NewReader(s))
		if err == nil {
			checkParsed(t, hs)
		}
	})
}

func FuzzParseDiscovered(f *testing.F) {
	for _, s := range []string{"h1:2\nh2\n", "h1:2\nh1:3", "\n\n", "[fe80::1]:1"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, s string, slots int) {
		hs, err := ParseDiscovered([]byte(s), slots%8)
		if err == nil {
			checkParsed(t, hs)
		}
	})
}
