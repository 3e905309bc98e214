package version

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
			if args := serveArgs[name]; args != nil {
				checkServed(t, bin, args)
			}
		})
	}
}

// serveArgs starts each server binary with its admin port on ADMIN (replaced by a free
// port) and nothing else it could need: the gateway in static mode, the rebalancer in dry
// run against a database and a Prometheus that are not there (it starts regardless).
var serveArgs = map[string]func(dir, admin string) []string{
	"gateway": func(dir, admin string) []string {
		cfg := filepath.Join(dir, "gateway-static.yaml")
		_ = os.WriteFile(cfg, []byte("region: eu-west\nlisten: 127.0.0.1:0\nadmin_listen: "+admin+"\n"+
			"routes: [{id: all, match: \"/\", upstream: \"http://127.0.0.1:9\"}]\n"+
			"tenants: [{id: dev, keys: [{secret: dev-key}]}]\n"), 0o600)
		return []string{"--config", cfg}
	},
	"rebalancer": func(_, admin string) []string {
		return []string{"--dry-run", "--admin-listen", admin, "--interval", "1h",
			"--database-url", "postgres://nobody@127.0.0.1:1/none", "--prometheus-url", "http://127.0.0.1:1"}
	},
}

// checkServed runs bin, waits for its `healthcheck` subcommand to pass on /healthz, and
// reads quotaplane_build_info with the -X stamp from its /metrics; the subcommand fails
// against a port nothing listens on.
func checkServed(t *testing.T, bin string, args func(dir, admin string) []string) {
	t.Helper()
	admin := freeAddr(t)
	cmd := exec.Command(bin, args(t.TempDir(), admin)...)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(bin), logs.String())
		}
	}()
	// Bounded wait for an external process to listen: the healthcheck subcommand polls.
	health := "http://" + admin + "/healthz"
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command(bin, "healthcheck", health).CombinedOutput()
		if err == nil {
			if !strings.Contains(string(out), "200 OK") {
				t.Errorf("healthcheck passed saying %q", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s healthcheck %s did not pass within 30s: %v %s", bin, health, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := BuildInfoMetric + `{commit="0123456789abcdef0123",goversion="` + runtime.Version() + `",version="v9.8.7"} 1`
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	out, err := exec.Command(bin, "healthcheck", "http://"+freeAddr(t)+"/readyz").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "healthcheck:") {
		t.Errorf("healthcheck of a closed port: %v %q, want exit status 1 and the reason", err, out)
	}
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestCollector(t *testing.T) {
	i := Info{Version: "v0.1.0", Commit: "c0ffee", Date: "2026-11-30T00:00:00Z", GoVersion: "go1.26.8", Platform: "linux/amd64"}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(i.Collector())
	want := `# HELP quotaplane_build_info A metric with a constant '1' value labelled by the version, commit and Go version this binary was built from.
# TYPE quotaplane_build_info gauge
quotaplane_build_info{commit="c0ffee",goversion="go1.26.8",version="v0.1.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), BuildInfoMetric); err != nil {
		t.Error(err)
	}
}
