package main

import (
	"slices"
	"strings"
	"testing"
)

// TestProcTicks: the CPU times are read after the command name, which may
// hold spaces and parentheses.
func TestProcTicks(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       uint64
		bad        bool
	}{
		{"plain", "42 (gorovod) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 10 20 0 1 0 5 0 0", 40, false},
		{"name with spaces", "42 (a (b) c) R 1 42 42 0 -1 0 0 0 0 0 1 2 3 4 20 0 1 0 5 0 0", 10, false},
		{"short", "42 (x) S 1 2 3", 0, true},
		{"no name", "42 x S", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := procTicks(tc.stat)
			if tc.bad {
				if err == nil {
					t.Fatalf("procTicks(%q) = %d, want an error", tc.stat, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("procTicks(%q) = %d, %v; want %d", tc.stat, got, err, tc.want)
			}
		})
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1G": 1e9, "10G": 1e10, "2.5G": 2.5e9, "100M": 1e8, "64K": 64e3, "1500": 1500} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "fast", "-1G", "1T"} {
		if _, err := parseRate(bad); err == nil {
			t.Errorf("parseRate(%q) accepted", bad)
		}
	}
}

func TestIntList(t *testing.T) {
	for _, tc := range []struct {
		in    string
		least int
		want  []int
		ok    bool
	}{
		{"1,2,4,8", 0, []int{1, 2, 4, 8}, true},
		{" 0, 4", 0, []int{0, 4}, true},
		{"0", 1, nil, false},
		{"2,,3", 0, nil, false},
		{"many", 0, nil, false},
		{"-1", 0, nil, false},
	} {
		got, err := intList("--sources", tc.in, tc.least)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("intList(%q, %d) = %v, %v; want %v (ok %v)", tc.in, tc.least, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--sources") {
			t.Errorf("intList(%q): error %q does not name the flag", tc.in, err)
		}
	}
}
