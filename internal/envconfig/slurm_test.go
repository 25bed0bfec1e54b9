package envconfig

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseHostlist(t *testing.T) {
	cases := []struct {
		in, want string // want: hosts joined by spaces; "" for an error
	}{
		{"node1", "node1"},
		{"node[01-03,07],gpu1", "node01 node02 node03 node07 gpu1"},
		{"n[9-11]", "n9 n10 n11"},
		{"n[09-11]", "n09 n10 n11"},
		{"a[1-2]b[3-4]", "a1b3 a1b4 a2b3 a2b4"},
		{"rack[1-2]-n[1],x", "rack1-n1 rack2-n1 x"},
		{"[1-3]", "1 2 3"},
		{"node[1-2]suffix", "node1suffix node2suffix"},
		{"a,b", "a b"},
		{" a , b ", "a b"},
		{"", ""},
		{"a,,b", ""},
		{"node[", ""},
		{"node]", ""},
		{"node[]", ""},
		{"node[3-1]", ""},
		{"node[a-b]", ""},
		{"node[1-]", ""},
		{"node[-1]", ""},
		{"node[1-2", ""},
		{"node[1-2]]", ""},
		{"n[0-99999999]", ""},
		{"n[0-256]m[0-255]", ""}, // 65792 hosts: more than allowed
		{"n[0-999999999999999999999]", ""},
	}
	for _, c := range cases {
		got, err := ParseHostlist(c.in)
		if c.want == "" {
			if err == nil {
				t.Errorf("ParseHostlist(%q) = %d hosts, want an error", c.in, len(got))
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseHostlist(%q): %v", c.in, err)
			continue
		}
		if s := strings.Join(got, " "); s != c.want {
			t.Errorf("ParseHostlist(%q) = %q, want %q", c.in, s, c.want)
		}
	}
	if hosts, err := ParseHostlist("n[0-255]m[0-255]"); err != nil || len(hosts) != MaxHostlistHosts {
		t.Errorf("256x256 hosts: %d, %v", len(hosts), err)
	}
}

func TestParseTasksPerNode(t *testing.T) {
	cases := []struct {
		in, want string
	}{
		{"1", "[1]"},
		{"2(x3),1", "[2 2 2 1]"},
		{"4,4,2(x2)", "[4 4 2 2]"},
		{"", ""},
		{"0", ""},
		{"2(x0)", ""},
		{"2(3)", ""},
		{"2(x3", ""},
		{"x", ""},
		{"-1", ""},
		{"1,,1", ""},
		{"1(x65537)", ""},
		{"1(x65536)", "many"},
	}
	for _, c := range cases {
		got, err := ParseTasksPerNode(c.in)
		switch {
		case c.want == "":
			if err == nil {
				t.Errorf("ParseTasksPerNode(%q) = %d counts, want an error", c.in, len(got))
			}
		case err != nil:
			t.Errorf("ParseTasksPerNode(%q): %v", c.in, err)
		case c.want == "many":
			if len(got) != MaxHostlistHosts {
				t.Errorf("ParseTasksPerNode(%q): %d entries", c.in, len(got))
			}
		case fmt.Sprint(got) != c.want:
			t.Errorf("ParseTasksPerNode(%q) = %v, want %s", c.in, got, c.want)
		}
	}
}

func TestLoadSlurm(t *testing.T) {
	full := map[string]string{
		EnvSlurmJobID: "42", EnvSlurmNodeList: "node[01-03],gpu1", EnvSlurmTasksPerNode: "2(x3),1", EnvSlurmNTasks: "7",
	}
	cases := []struct {
		name   string
		change map[string]string
		ok     bool
		want   string // "" for an error
	}{
		{"outside Slurm", map[string]string{EnvSlurmJobID: ""}, false, "{ [] 0 0}"},
		{"full", nil, true, "{42 [{node01 2} {node02 2} {node03 2} {gpu1 1}] 7 0}"},
		{"no task count", map[string]string{EnvSlurmNTasks: ""}, true, "{42 [{node01 2} {node02 2} {node03 2} {gpu1 1}] 7 0}"},
		{"fewer tasks than slots", map[string]string{EnvSlurmNTasks: "5"}, true, "{42 [{node01 2} {node02 2} {node03 2} {gpu1 1}] 5 0}"},
		{"old names", map[string]string{EnvSlurmJobID: "", "SLURM_JOBID": "43", EnvSlurmNodeList: "", "SLURM_NODELIST": "a", EnvSlurmTasksPerNode: "3", EnvSlurmNTasks: ""}, true, "{43 [{a 3}] 3 0}"},
		{"CPUs per task", map[string]string{EnvSlurmCPUsPerTask: "4"}, true, "{42 [{node01 2} {node02 2} {node03 2} {gpu1 1}] 7 4}"},
		{"CPUs per task not a count", map[string]string{EnvSlurmCPUsPerTask: "0"}, true, ""},
		{"more tasks than slots", map[string]string{EnvSlurmNTasks: "8"}, true, ""},
		{"task count not a number", map[string]string{EnvSlurmNTasks: "x"}, true, ""},
		{"count mismatch", map[string]string{EnvSlurmTasksPerNode: "2(x3)"}, true, ""},
		{"no node list", map[string]string{EnvSlurmNodeList: ""}, true, ""},
		{"bad node list", map[string]string{EnvSlurmNodeList: "node[1-"}, true, ""},
		{"bad tasks", map[string]string{EnvSlurmTasksPerNode: "2(x"}, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range full {
				env[k] = v
			}
			for k, v := range c.change {
				env[k] = v
			}
			a, ok, err := LoadSlurm(func(k string) string { return env[k] })
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if c.want == "" {
				if err == nil {
					t.Fatalf("accepted: %+v", a)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(a); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}

// FuzzParseHostlist: no input panics or expands past the limit, every host is
// a plain name, and a parsed list parses again, written out, to itself.
func FuzzParseHostlist(f *testing.F) {
	for _, s := range []string{"node[01-03,07],gpu1", "a[1-2]b[3-4]", "n[9-11]", "x", "[", "a[1-2,", "n[0-256]m[0-255]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ParseHostlist(s)
		if err != nil {
			return
		}
		if len(hosts) == 0 || len(hosts) > MaxHostlistHosts {
			t.Fatalf("%q: %d hosts", s, len(hosts))
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[], \t\n") {
				t.Fatalf("%q: host %q", s, h)
			}
		}
		again, err := ParseHostlist(strings.Join(hosts, ","))
		if err != nil || !slices.Equal(again, hosts) {
			t.Fatalf("%q: expanded list does not parse to itself: %v", s, err)
		}
	})
}

// FuzzParseTasksPerNode: no input panics or expands past the limit, every
// count is positive, and the expanded counts parse again to themselves.
func FuzzParseTasksPerNode(f *testing.F) {
	for _, s := range []string{"2(x3),1", "1", "4,4,2(x2)", "1(x65536)", "2(x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		counts, err := ParseTasksPerNode(s)
		if err != nil {
			return
		}
		if len(counts) == 0 || len(counts) > MaxHostlistHosts {
			t.Fatalf("%q: %d counts", s, len(counts))
		}
		parts := make([]string, len(counts))
		for i, c := range counts {
			if c < 1 {
				t.Fatalf("%q: count %d", s, c)
			}
			parts[i] = fmt.Sprint(c)
		}
		again, err := ParseTasksPerNode(strings.Join(parts, ","))
		if err != nil || !slices.Equal(again, counts) {
			t.Fatalf("%q: expanded counts do not parse to themselves: %v", s, err)
		}
	})
}
