package cli

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Version describes the running program as `gorovod --version` prints it: the
// main module's path and version ("(devel)" for a build from a source tree),
// the VCS commit it was built from with "+dirty" when the tree had
// uncommitted changes, the commit time, and the Go version. Builds made with
// -buildvcs=false (or outside a repository) carry no commit, and say so.
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "gorovod: no build information (not built with module support)"
	}
	return formatVersion(info)
}

func formatVersion(info *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	version := info.Main.Version
	if version == "" {
		version = "(unknown version)"
	}
	path := info.Main.Path
	if path == "" {
		path = info.Path
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", path, version)
	if rev := settings["vcs.revision"]; rev != "" {
		if settings["vcs.modified"] == "true" {
			rev += "+dirty"
		}
		fmt.Fprintf(&b, ", commit %s", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, " (%s)", t)
		}
	} else {
		b.WriteString(", commit unknown (built without VCS information, e.g. -buildvcs=false)")
	}
	fmt.Fprintf(&b, ", %s", info.GoVersion)
	return b.String()
}
