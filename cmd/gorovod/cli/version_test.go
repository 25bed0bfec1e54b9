package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormatVersion(t *testing.T) {
	main := debug.Module{Path: "github.com/gorovod/gorovod", Version: "v0.3.0"}
	cases := []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.time", Value: "2026-11-23T10:00:00Z"}, {Key: "vcs.modified", Value: "false"}},
			"github.com/gorovod/gorovod v0.3.0, commit 0123abc (2026-11-23T10:00:00Z), go1.26.8"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123abc"}, {Key: "vcs.modified", Value: "true"}},
			"github.com/gorovod/gorovod v0.3.0, commit 0123abc+dirty, go1.26.8"},
		{nil, "github.com/gorovod/gorovod v0.3.0, commit unknown (built without VCS information, e.g. -buildvcs=false), go1.26.8"},
	}
	for _, c := range cases {
		got := formatVersion(&debug.BuildInfo{GoVersion: "go1.26.8", Main: main, Settings: c.settings})
		if got != c.want {
			t.Errorf("got %q\nwant %q", got, c.want)
		}
	}
	if v := Version(); !strings.Contains(v, "go1.") {
		t.Errorf("Version() = %q", v)
	}
}
