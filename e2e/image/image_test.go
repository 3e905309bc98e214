package image

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m)) }

const (
	image   = "ghcr.io/quotaplane/gateway:e2e"
	version = "v0.0.0-image-test"
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// storageDriver is what buildah stores images with: $STORAGE_DRIVER, else vfs, which works
// everywhere (overlay does not inside most containers).
func storageDriver() string {
	if d := os.Getenv("STORAGE_DRIVER"); d != "" {
		return d
	}
	return "vfs"
}

// buildah runs buildah on a storage of its own (a storage.conf whose graph and run roots,
// and the TMPDIR that holds the build's cache mounts, are under dir): whatever the test
// builds, the build stage and its caches included, goes when dir goes, and images of
// other builds on this machine are neither reused nor touched.
type buildah struct {
	t   *testing.T
	bin string
	env []string // CONTAINERS_STORAGE_CONF and TMPDIR
}

func newBuildah(t *testing.T, bin string) buildah {
	dir, err := os.MkdirTemp("", "quotaplane-image-test-")
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "storage.conf")
	tmp := filepath.Join(dir, "tmp")
	data := fmt.Sprintf("[storage]\ndriver = %q\ngraphroot = %q\nrunroot = %q\n", storageDriver(), filepath.Join(dir, "graph"), filepath.Join(dir, "run"))
	if err := os.WriteFile(conf, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	b := buildah{t: t, bin: bin, env: []string{"CONTAINERS_STORAGE_CONF=" + conf, "TMPDIR=" + tmp}}
	t.Cleanup(func() {
		// Containers, then images, then the storage itself: nothing is left behind.
		for _, args := range [][]string{{"rm", "--all"}, {"rmi", "--all", "--force"}} {
			if out, err := b.cmd(context.Background(), args...).CombinedOutput(); err != nil {
				t.Errorf("cleanup: buildah %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return b
}

func (b buildah) cmd(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, b.bin, append([]string{"--storage-driver", storageDriver()}, args...)...)
	c.Env = append(os.Environ(), b.env...)
	return c
}

func (b buildah) out(args ...string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := b.cmd(ctx, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		b.t.Fatalf("buildah %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}

// TestGatewayImage builds the gateway image, inspects it, and runs it against real servers.
func TestGatewayImage(t *testing.T) {
	bin, err := exec.LookPath("buildah")
	if err != nil {
		t.Fatal("buildah not found: install the Debian packages buildah and busybox-static (make deps)")
	}
	b := newBuildah(t, bin)

	// Build as `make image` does, from the local Go toolchain.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, filepath.Join(repoRoot(), "deploy", "image", "build.sh"), "gateway")
	build.Env = append(append(os.Environ(), b.env...), "CONTAINER_TOOL=buildah", "GO_IMAGE=local", "TAG=e2e",
		"VERSION="+version, "COMMIT=0123456789abcdef0123456789abcdef01234567", "DATE=2026-11-30T21:00:00Z",
		"STORAGE_DRIVER="+storageDriver())
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("deploy/image/build.sh gateway: %v\n%s", err, tail(out, 4000))
	}
	t.Logf("built %s in %v", image, time.Since(start).Round(time.Second))

	ctr := b.out("from", image)
	t.Cleanup(func() { _ = b.cmd(context.Background(), "rm", ctr).Run() })

	t.Run("config", func(t *testing.T) {
		if got := b.out("inspect", "--format", "{{.OCIv1.Config.User}}", ctr); got != "65532:65532" {
			t.Errorf("user %q, want 65532:65532 (non-root, as the manifests run it)", got)
		}
		if got := b.out("inspect", "--format", "{{.OCIv1.Config.Entrypoint}}", ctr); got != "[/usr/local/bin/gateway]" {
			t.Errorf("entrypoint %s", got)
		}
	})

	t.Run("contents", func(t *testing.T) {
		mnt := b.out("mount", ctr)
		t.Cleanup(func() { _ = b.cmd(context.Background(), "umount", ctr).Run() })
		var files []string
		err := filepath.WalkDir(mnt, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(mnt, p)
			files = append(files, "/"+rel)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// FROM scratch: the binary, CA certificates, passwd and group; nothing else (no
		// shell). /etc/hostname, hosts and resolv.conf are the runtime's mount points.
		want := []string{"/etc/group", "/etc/passwd", "/etc/ssl/certs/ca-certificates.crt", "/usr/local/bin/gateway"}
		var got []string
		for _, f := range files {
			if !slices.Contains([]string{"/etc/hostname", "/etc/hosts", "/etc/resolv.conf"}, f) {
				got = append(got, f)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("image files %v, want %v", got, want)
		}
		f, err := elf.Open(filepath.Join(mnt, "usr/local/bin/gateway"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("the gateway binary is dynamically linked: it cannot run FROM scratch")
			}
		}
		passwd, _ := os.ReadFile(filepath.Join(mnt, "etc/passwd"))
		if !strings.Contains(string(passwd), ":65532:65532:") {
			t.Errorf("/etc/passwd does not name user 65532: %q", passwd)
		}
	})

	t.Run("version", func(t *testing.T) {
		got := b.out("run", "--isolation", "chroot", ctr, "--", "/usr/local/bin/gateway", "--version")
		if want := "gateway " + version + " (commit 0123456789ab, built 2026-11-30T21:00:00Z"; !strings.HasPrefix(got, want) {
			t.Errorf("--version = %q, want prefix %q", got, want)
		}
	})

	t.Run("serves", func(t *testing.T) { runGateway(t, b, ctr) })
}

// runGateway runs the image's gateway (buildah run, host network) against a test Redis and
// PostgreSQL: a tenant with capacity 3 and a trickle refill gets 3 requests through to the
// upstream, then 429, decided by Redis.
func runGateway(t *testing.T, b buildah, ctr string) {
	ctx := context.Background()
	redis := testenv.Redis(t)
	dbURL := testenv.PostgresDB(t)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	actx := store.WithAudit(ctx, "image-test", "setup")
	if err := st.AddRegion(actx, "us-east"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetRule(actx, regions.Rule{Tenant: "shop-a", Route: "*", Capacity: 3, RefillPerSecond: 0.001}); err != nil {
		t.Fatal(err)
	}
	key, _, err := st.CreateKey(actx, "shop-a", "image test")
	if err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "upstream ok") }))
	defer upstream.Close()

	proxyPort, adminPort := freePort(t), freePort(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`region: us-east
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
expected_instances: 1
drain_timeout: 1s
# This test is about the image, not timeouts: a first call that outlasted the default
# 5 ms (a cold connection in a chroot) would be decided by the fallback and, its reply
# unread, charged twice (under-admission by design), so 2 of 3 would pass, not 3.
redis: {timeout: 250ms}
routes:
  - {id: api, match: "/", upstream: %q}
`, proxyPort, adminPort, upstream.URL)
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	logs := &strings.Builder{}
	cmd := b.cmd(context.Background(), "run", "--isolation", "chroot",
		"--volume", dir+":/etc/quotaplane:ro",
		"--env", "RATELIMIT_DATABASE_URL="+dbURL,
		"--env", "RATELIMIT_REDIS_URL="+testenv.RedisURL(redis),
		ctr, "--", "/usr/local/bin/gateway", "--config", "/etc/quotaplane/gateway.yaml")
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", tail([]byte(logs.String()), 4000))
		}
	}()

	// Ready: the image's gateway loaded the snapshot from PostgreSQL (bounded wait for an
	// external process; no hook into it exists).
	client := &http.Client{Timeout: 2 * time.Second}
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := client.Get(admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the gateway exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway was not ready within 60s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The image's own healthcheck (compose.yaml's): no shell or curl, the binary asks.
	hc, err := b.cmd(context.Background(), "run", "--isolation", "chroot", ctr, "--",
		"/usr/local/bin/gateway", "healthcheck", admin+"/readyz").CombinedOutput()
	if err != nil || !strings.Contains(string(hc), "200 OK: ready") {
		t.Errorf("gateway healthcheck in the image: %v %q, want exit 0 and 200 OK: ready", err, hc)
	}

	var codes []int
	for range 5 {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/v1/search", proxyPort), nil)
		req.Header.Set("X-Api-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusOK && string(body) != "upstream ok" {
			t.Errorf("200 without the upstream's body: %q", body)
		}
	}
	if want := []int{200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("status codes %v, want %v (capacity 3, trickle refill)", codes, want)
	}
	resp, err := client.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `quotaplane_build_info{commit="0123456789abcdef0123456789abcdef01234567",goversion="` + runtime.Version() + `",version="` + version + `"} 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s:\n%s", want, grepLines(string(metrics), "build_info"))
	}
	if !strings.Contains(string(metrics), `source="redis"} 3`) && !strings.Contains(string(metrics), `decision="allowed",region="us-east",route="api",source="redis"} 3`) {
		t.Errorf("no 3 allowed decisions by Redis in /metrics:\n%s", grepLines(string(metrics), "ratelimit_requests_total"))
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
