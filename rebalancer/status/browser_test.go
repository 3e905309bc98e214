package status_test

import (
	"bytes"
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status"
)

var docsScreenshot = flag.Bool("docs-screenshot", false,
	"also write the browser test's screenshot to docs/status-page.png (after a minute of shaped traffic)")

// chromium finds Debian's chromium; a missing browser fails the test.
func chromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Fatal("chromium not found: install the Debian package chromium (apt-get install -y chromium, or run deploy/install-deps.sh)")
	return ""
}

// TestBrowser loads the page in headless Chromium, checks what a reader sees (both regions,
// a share change, the charts, the embedded CSS and script under the page's CSP, no console
// error) and saves a screenshot.
func TestBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	e := newEnv(t)
	h := e.handler(t, func(c *status.Config) {
		c.LastRun = func() job.Report {
			return job.Report{At: time.Now().Add(-12 * time.Second), Kind: "run", Result: job.ResultOK, Written: 2}
		}
		if *docsScreenshot {
			c.ChartRange = time.Minute
		}
	})
	waitLive(t, h)
	if *docsScreenshot {
		shapeTraffic(t, e)
	}
	srv := httptest.NewServer(h) // 127.0.0.1
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), // containers have a small /dev/shm
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()

	// Console errors (a CSP violation, a failed asset, a script exception) fail the test.
	var (
		mu       sync.Mutex
		messages []string
		wg       sync.WaitGroup
	)
	consoleCtx, stopConsole := context.WithCancel(bctx)
	console := chromedp.Console(consoleCtx)
	wg.Go(func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" || m.Type == "warning" {
				mu.Lock()
				messages = append(messages, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	})

	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#changes table"))); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	text, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("main")))
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "rendered page", text, usEast, euWest, "Regions", "Recent share changes", "50.0% → 70.0%", "throttling",
		"pinned to eu-west during the migration", "shop-a/create-order")
	mustNotContain(t, "rendered page", text, "Prometheus unreachable")
	regionCards, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("article.region h3"), e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(regionCards, ",") != euWest+","+usEast {
		t.Errorf("region cards %v", regionCards)
	}
	lines, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#chart-share polyline, #chart-throttled polyline").length`))
	if err != nil {
		t.Fatal(err)
	}
	if lines < 4 {
		t.Errorf("%d chart lines drawn, want one per region in both charts", lines)
	}
	// The embedded stylesheet applied, and the embedded script ran under the CSP.
	bg, err := chromedp.Run(bctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector("header.top")).backgroundColor`))
	if err != nil {
		t.Fatal(err)
	}
	if bg != "rgb(36, 41, 47)" {
		t.Errorf("header background %q: style.css not applied", bg)
	}
	var stamp string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if stamp, err = chromedp.Run(bctx, chromedp.Text(chromedp.CSS("header.top time"))); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(stamp, " ago)") || time.Now().After(deadline) {
			break
		}
	}
	if !strings.HasSuffix(stamp, " ago)") {
		t.Errorf("header time %q: app.js did not run", stamp)
	}

	if n, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll(".badge.stale").length`)); err != nil || n != 0 {
		t.Errorf("a fresh rebalancer shows %d stale badges (%v)", n, err)
	}

	// A rebalancer whose last tick is older than its bound: the header says stale, in the
	// error colours (issue 22).
	stale := e.handler(t, func(c *status.Config) {
		c.LastRun = func() job.Report {
			return job.Report{At: time.Now().Add(-10 * time.Minute), Kind: "check", Result: job.ResultOK}
		}
		c.StaleAfter = time.Minute
	})
	staleSrv := httptest.NewServer(stale)
	t.Cleanup(staleSrv.Close)
	if err := chromedp.Do(bctx, chromedp.Navigate(staleSrv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("header.top .badge.stale"))); err != nil {
		t.Fatalf("stale page: %v", err)
	}
	badge, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("header.top .badge.stale")))
	if err != nil || badge != "stale" {
		t.Errorf("stale badge text %q (%v)", badge, err)
	}
	if c, err := chromedp.Run(bctx, chromedp.Evaluate[string](`getComputedStyle(document.querySelector(".badge.stale")).color`)); err != nil || c == "" || c == "rgb(0, 0, 0)" {
		t.Errorf("stale badge colour %q (%v): style not applied", c, err)
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#changes table"))); err != nil {
		t.Fatalf("reload the page: %v", err)
	}

	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Fatalf("screenshot: %d bytes, not a PNG of a page", len(png))
	}
	shot := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	if *docsScreenshot {
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "status-page.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	stopConsole()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, m := range messages {
		t.Errorf("browser console: %s", m)
	}
}

// shapeTraffic gives the docs screenshot's charts a story: us-east's throttling eases as
// its share grows, then eu-west starts to be throttled. About a minute.
func shapeTraffic(t *testing.T, e *env) {
	t.Helper()
	for _, step := range []struct{ usThrottled, euThrottled, usShare float64 }{
		{20, 0, 0.6}, {14, 0, 0.65}, {6, 0, 0.7}, {4, 3, 0.7}, {2, 6, 0.68}, {3, 4, 0.7},
	} {
		e.reqs.SetRegion(usEast, 50, step.usThrottled, 0)
		e.reqs.SetRegion(euWest, 30, step.euThrottled, 0)
		e.shares.share.WithLabelValues(usEast, "*").Set(step.usShare)
		e.shares.share.WithLabelValues(euWest, "*").Set(1 - step.usShare)
		for id, r := range map[string]string{"gw-use-1": usEast, "gw-use-2": usEast, "gw-euw-1": euWest} {
			if err := e.store.Heartbeat(t.Context(), id, r); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Second) // real traffic over wall-clock time, for Prometheus to scrape
	}
}
