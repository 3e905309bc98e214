// Package version is the build stamp of every binary of this module: version, commit and
// build date, set at link time and otherwise read from the Go build information.
//
// Stamp a build with
//
//	go build -ldflags "-X github.com/quotaplane/quotaplane/internal/version.version=v0.1.0 \
//	  -X github.com/quotaplane/quotaplane/internal/version.commit=$(git rev-parse HEAD) \
//	  -X github.com/quotaplane/quotaplane/internal/version.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
//
// (the Makefile and Dockerfile do). Without -X, Get falls back to debug.ReadBuildInfo: the
// module version of `go install ...@v0.1.0`, the VCS revision and time of a build inside a
// git checkout. It imports nothing from this module.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X (see the package comment). Strings only: -X cannot set other types.
var (
	version = ""
	commit  = ""
	date    = ""
)

// Info is one binary's build stamp.
type Info struct {
	Version   string `json:"version"`    // "v0.1.0", or "dev" when unknown
	Commit    string `json:"commit"`     // full VCS revision, or "unknown"
	Date      string `json:"date"`       // RFC 3339 build (or commit) time, or "unknown"
	Modified  bool   `json:"modified"`   // built from a tree with uncommitted changes
	GoVersion string `json:"go_version"` // runtime.Version()
	Platform  string `json:"platform"`   // GOOS/GOARCH
}

// Get is the build stamp: the -X values where set, else what the Go build info knows.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return build(version, commit, date, bi)
}

// build merges the link-time values with the build info (nil when unavailable).
func build(v, c, d string, bi *debug.BuildInfo) Info {
	i := Info{Version: v, Commit: c, Date: d, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.time":
				if i.Date == "" {
					i.Date = s.Value
				}
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	if i.Date == "" {
		i.Date = "unknown"
	}
	return i
}

// String is the one line `--version` prints: "gateway v0.1.0 (commit 0123abc, built
// 2026-11-30T21:00:00Z, go1.26 linux/amd64)".
func (i Info) String() string {
	c := i.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, built %s, %s %s)", i.Version, c, i.Date, i.GoVersion, i.Platform)
}
