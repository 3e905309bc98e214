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
// git checkout.
//
// The same stamp is on every binary's /metrics as quotaplane_build_info (Info.Collector),
// so a dashboard or an alert can tell which build a series came from. It imports nothing
// from this module.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
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

// BuildInfoMetric is the name of the series Collector exports.
const BuildInfoMetric = "quotaplane_build_info"

// Collector is the gauge quotaplane_build_info, always 1, labelled with this build's
// version, commit and goversion (the <program>_build_info convention: join on it, or
// count it by version during a rollout). Register it on the registry /metrics serves.
func (i Info) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        BuildInfoMetric,
		Help:        "A metric with a constant '1' value labelled by the version, commit and Go version this binary was built from.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion},
	}, func() float64 { return 1 })
}
