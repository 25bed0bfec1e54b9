package envconfig

import (
	"testing"
	"time"
)

func TestLeaveNotice(t *testing.T) {
	for _, tc := range []struct {
		v       string
		want    time.Duration
		ok, bad bool
	}{
		{"", 0, false, false},
		{"25s", 25 * time.Second, true, false},
		{"1500ms", 1500 * time.Millisecond, true, false},
		{"1h", time.Hour, true, false},
		{"0s", 0, false, true},
		{"-3s", 0, false, true},
		{"2h", 0, false, true},
		{"25", 0, false, true},
		{"soon", 0, false, true},
	} {
		d, ok, err := LeaveNotice(func(k string) string {
			if k == EnvLeaveNotice {
				return tc.v
			}
			return ""
		})
		if d != tc.want || ok != tc.ok || (err != nil) != tc.bad {
			t.Errorf("%s=%q: %v, %v, %v", EnvLeaveNotice, tc.v, d, ok, err)
		}
	}
}
