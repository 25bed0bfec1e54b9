package spin

import "testing"

func TestCountCPUList(t *testing.T) {
	for _, tc := range []struct {
		list string
		want int
	}{
		{"0", 1}, {"0-1", 2}, {"0-3,8,10-11", 7}, {"", 0}, {"x", 0}, {"3-1", 0}, {"0-", 0}, {"-1", 0},
	} {
		if got := countCPUList(tc.list); got != tc.want {
			t.Errorf("countCPUList(%q) = %d, want %d", tc.list, got, tc.want)
		}
	}
	if HostCPUs() < 1 {
		t.Errorf("HostCPUs() = %d", HostCPUs())
	}
}
