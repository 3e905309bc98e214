package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestBuild(t *testing.T) {
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abcdef0123456789abcdef"},
		{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		name    string
		v, c, d string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"nothing known", "", "", "", nil, Info{Version: "dev", Commit: "unknown", Date: "unknown"}},
		{"devel module", "", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, Info{Version: "dev", Commit: "unknown", Date: "unknown"}},
		{"build info only", "", "", "", vcs, Info{Version: "v1.2.3", Commit: "abcdef0123456789abcdef", Date: "2026-01-02T03:04:05Z", Modified: true}},
		{"-X wins", "v0.1.0", "c0ffee", "2026-11-30T00:00:00Z", vcs, Info{Version: "v0.1.0", Commit: "c0ffee", Date: "2026-11-30T00:00:00Z", Modified: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := build(tc.v, tc.c, tc.d, tc.bi)
			tc.want.GoVersion, tc.want.Platform = runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH
			if got != tc.want {
				t.Errorf("build = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestLdflags links each binary with -X and runs its --version (and --help, which must
// exit 0): the -X paths in the
// Makefile and Dockerfile are this package's, and a typo there would silently print "dev".
func TestLdflags(t *testing.T) {
	dir := t.TempDir()
	const pkg = "github.com/quotaplane/quotaplane/internal/version"
	ld := "-X " + pkg + ".version=v9.8.7 -X " + pkg + ".commit=0123456789abcdef0123 -X " + pkg + ".date=2026-11-30T21:00:00Z"
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, name := range []string{"gateway", "rebalancer", "ratectl"} {
		t.Run(name, func(t *testing.T) {
			bin := filepath.Join(dir, name)
			build := exec.Command(gobin, "build", "-ldflags", ld, "-o", bin, "github.com/quotaplane/quotaplane/cmd/"+name)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			out, err := exec.Command(bin, "--version").Output()
			if err != nil {
				t.Fatalf("%s --version: %v", name, err)
			}
			if want := name + " v9.8.7 (commit 0123456789ab, built 2026-11-30T21:00:00Z"; !strings.HasPrefix(string(out), want) {
				t.Errorf("%s --version prints %q, want prefix %q", name, out, want)
			}
			// Asking for help is no failure: exit 0 with the usage.
			if out, err := exec.Command(bin, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "-version") {
				t.Errorf("%s --help: %v, output %q", name, err, out)
			}
		})
	}
}
