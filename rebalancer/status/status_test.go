package status_test

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func near(got *float64, want, tol float64) bool { return got != nil && math.Abs(*got-want) <= tol }

func TestPage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h := e.handler(t, func(c *status.Config) {
		c.LastRun = func() job.Report {
			return job.Report{At: time.Now().Add(-10 * time.Second), Kind: "run", Result: job.ResultOK, Written: 2}
		}
	})
	st := waitLive(t, h)

	t.Run("regions", func(t *testing.T) {
		if len(st.Regions) != 2 || st.Regions[0].Name != euWest || st.Regions[1].Name != usEast {
			t.Fatalf("regions %+v, want eu-west and us-east", st.Regions)
		}
		eu, us := st.Regions[0], st.Regions[1]
		if us.LiveGateways != 2 || eu.LiveGateways != 1 || us.Dark || eu.Dark || len(us.Gateways) != 2 || !us.Gateways[0].Live {
			t.Errorf("gateways: us-east %d %+v, eu-west %d", us.LiveGateways, us.Gateways, eu.LiveGateways)
		}
		if us.Share != 0.7 || eu.Share != 0.3 || us.ShareSource != "rebalancer" || us.ShareReason != "waterfill" || us.ShareSetAt == nil {
			t.Errorf("default shares: us-east %v %s %q, eu-west %v", us.Share, us.ShareSource, us.ShareReason, eu.Share)
		}
		if !near(us.ThrottledRPS, 20, 1) || !near(us.OfferedRPS, 70, 2) || !near(us.ThrottleRatio, 20.0/70, 0.02) {
			t.Errorf("us-east rates: throttled %v offered %v ratio %v, want 20, 70, 0.29", deref(us.ThrottledRPS), deref(us.OfferedRPS), deref(us.ThrottleRatio))
		}
		if !near(eu.ThrottledRPS, 0, 0) || !near(eu.AllowedRPS, 30, 1) || !near(eu.ThrottleRatio, 0, 0) {
			t.Errorf("eu-west rates: throttled %v allowed %v", deref(eu.ThrottledRPS), deref(eu.AllowedRPS))
		}
	})
	t.Run("tenant shares", func(t *testing.T) {
		var got []string
		for _, s := range st.TenantShares {
			got = append(got, fmt.Sprintf("%s %.2f", s.Scope, s.MaxDeviation))
		}
		// shop-c equals the default and is left out; the override of shop-d differs most.
		want := []string{"shop-d 0.50", "shop-a/create-order 0.20", "shop-b 0.02"}
		if strings.Join(got, ", ") != strings.Join(want, ", ") || st.TenantScopes != 4 {
			t.Fatalf("tenant shares %v of %d, want %v of 4", got, st.TenantScopes, want)
		}
		d := st.TenantShares[0].Regions[0] // eu-west of shop-d
		if d.Region != euWest || d.Source != "override" || d.Share != 0.8 || d.DefaultShare != 0.3 || math.Abs(d.Deviation-0.5) > 1e-9 {
			t.Errorf("shop-d in eu-west: %+v", d)
		}
	})
	t.Run("changes", func(t *testing.T) {
		if len(st.Changes) == 0 || st.Changes[0].Scope != "shop-d" || st.Changes[0].Actor != "alice" || st.Changes[0].Source != "override" || st.Changes[0].ExpiresAt == nil {
			t.Fatalf("newest change %+v, want alice's override of shop-d", st.Changes)
		}
		var found bool
		for _, c := range st.Changes {
			if c.Scope == "*" && c.Region == usEast && near(c.Old, 0.5, 0) && near(c.New, 0.7, 0) {
				found = true
				if c.Trigger != "throttling" || c.Kind != "run" || c.Reason != "waterfill" || c.Actor != job.DefaultActor ||
					len(c.Demand) != 2 || c.Demand[1].Region != usEast || c.Demand[1].OfferedRPS != 140 || c.Demand[1].Share != 0.7 {
					t.Errorf("the us-east change of * lacks its inputs: %+v", c)
				}
			}
		}
		if !found {
			t.Errorf("no change of * in us-east from 0.5 to 0.7 in %+v", st.Changes)
		}
		for i := 1; i < len(st.Changes); i++ {
			if st.Changes[i].At.After(st.Changes[i-1].At) {
				t.Errorf("changes not newest first at %d", i)
			}
		}
	})
	t.Run("charts", func(t *testing.T) {
		if st.Charts.StepSeconds != 1 || len(st.Charts.Share) != 2 || len(st.Charts.ThrottledRPS) != 2 {
			t.Fatalf("charts %+v", st.Charts)
		}
		us := st.Charts.Share[1].Points
		if st.Charts.Share[1].Region != usEast || us[len(us)-1].V != 0.7 {
			t.Errorf("us-east share chart ends at %v, want 0.7", us[len(us)-1])
		}
		th := st.Charts.ThrottledRPS[1].Points
		if v := th[len(th)-1].V; math.Abs(v-20) > 1 {
			t.Errorf("us-east throttled chart ends at %v, want 20", v)
		}
	})
	if st.LastRun == nil || st.LastRun.Result != job.ResultOK || st.LastRun.Written != 2 {
		t.Errorf("last run %+v", st.LastRun)
	}

	t.Run("html", func(t *testing.T) {
		code, hdr, body := get(t, h, "/")
		if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
			t.Fatalf("GET / = %d %s", code, hdr.Get("Content-Type"))
		}
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("CSP %q", csp)
		}
		mustContain(t, "page", body, usEast, euWest, "70.0%", "30.0%", "2 of 2", "50.0% → 70.0%", "throttling",
			"pinned to eu-west during the migration", "shop-a/create-order", "&#43;50.0 pp", "<polyline", `aria-label="Default share`,
			"140/s offered", `class="badge result-ok"`)
		mustNotContain(t, "page", body, "Prometheus unreachable", `src="http`, `href="http`, "no data")
		tenants := body[strings.Index(body, `id="tenant-shares"`):strings.Index(body, `id="changes"`)]
		mustContain(t, "tenant table", tenants, "shop-d", "shop-b")
		mustNotContain(t, "tenant table", tenants, "shop-c")
		if n := strings.Count(body, "<script"); n != 1 {
			t.Errorf("%d script elements, want only the embedded app.js", n)
		}
	})
	t.Run("json", func(t *testing.T) {
		code, hdr, body := get(t, h, "/status.json")
		if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
			t.Fatalf("GET /status.json = %d %s", code, hdr.Get("Content-Type"))
		}
		// The field names are a contract for scripts: pin them.
		mustContain(t, "status.json", body, `"generated_at"`, `"prometheus"`, `"reachable": true`, `"regions"`, `"name": "us-east"`,
			`"live_gateways": 2`, `"share_source": "rebalancer"`, `"throttled_rps"`, `"offered_rps"`, `"throttle_ratio"`,
			`"tenant_shares"`, `"max_deviation"`, `"changes"`, `"old_share": 0.5`, `"new_share": 0.7`, `"trigger": "throttling"`,
			`"demand"`, `"charts"`, `"step_seconds"`, `"last_run"`)
		got := decodeStatus(t, body)
		if len(got.Regions) != 2 || len(got.Changes) != len(st.Changes) || len(got.TenantShares) != 3 {
			t.Errorf("status.json: %d regions, %d changes, %d tenant shares", len(got.Regions), len(got.Changes), len(got.TenantShares))
		}
	})
	t.Run("limits", func(t *testing.T) {
		h := e.handler(t, func(c *status.Config) { c.TopScopes, c.HistoryLimit = 1, 3 })
		st, err := h.Collect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(st.TenantShares) != 1 || st.TenantShares[0].Scope != "shop-d" || st.TenantScopes != 4 || len(st.Changes) != 3 {
			t.Errorf("top 1 and 3 changes: %d %+v, %d changes", st.TenantScopes, st.TenantShares, len(st.Changes))
		}
	})
	t.Run("assets", func(t *testing.T) {
		for path, want := range map[string]string{
			"/assets/style.css":            "text/css",
			"/assets/app.js":               "javascript",
			"/assets/nope.css":             "404",
			"/templates/page.html.tmpl":    "404",
			"/assets/../templates/x":       "404",
			"/status.json/x":               "404",
			"/assets/templates/layout.tmp": "404",
		} {
			code, hdr, _ := get(t, h, path)
			if want == "404" {
				if code == http.StatusOK {
					t.Errorf("GET %s = %d, want it not served", path, code)
				}
				continue
			}
			if code != http.StatusOK || !strings.Contains(hdr.Get("Content-Type"), want) {
				t.Errorf("GET %s = %d %q, want 200 %s", path, code, hdr.Get("Content-Type"), want)
			}
		}
	})
}

func deref(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}

// TestPrometheusUnreachable: the page keeps rendering from PostgreSQL when one or every
// Prometheus fails, is stopped or hangs, and says so.
func TestPrometheusUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("http://127.0.0.1:%d", port)

	t.Run("one region's server", func(t *testing.T) {
		h := e.handler(t, func(c *status.Config) {
			c.Prometheus = []status.Source{{Region: usEast, API: promAPI(t, e.prom.URL())}, {Region: euWest, API: promAPI(t, dead)}}
		})
		deadline := time.Now().Add(40 * time.Second)
		var st *status.Status
		for {
			if st, err = h.Collect(t.Context()); err != nil {
				t.Fatal(err)
			}
			if near(st.Regions[1].ThrottledRPS, 20, 0.5) || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if st.Prometheus.Reachable || strings.Join(st.Prometheus.Unreachable, ",") != euWest {
			t.Errorf("prometheus %+v, want eu-west unreachable", st.Prometheus)
		}
		if st.Regions[0].ThrottledRPS != nil || !near(st.Regions[1].ThrottledRPS, 20, 1) {
			t.Errorf("rates: eu-west %v (want none), us-east %v (want 20)", deref(st.Regions[0].ThrottledRPS), deref(st.Regions[1].ThrottledRPS))
		}
		code, _, body := get(t, h, "/")
		if code != http.StatusOK {
			t.Fatalf("GET / = %d", code)
		}
		mustContain(t, "page", body, "Prometheus unreachable for eu-west", "70.0%")
	})

	t.Run("hanging", func(t *testing.T) {
		if err := e.prom.Pause(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := e.prom.Resume(); err != nil {
				t.Error(err)
			}
		}()
		// A stop signal lands when the process is next scheduled: wait until it no longer
		// answers at all.
		probe := &http.Client{Timeout: 300 * time.Millisecond}
		for deadline := time.Now().Add(10 * time.Second); ; {
			resp, err := probe.Get(e.prom.URL() + "/-/ready")
			if err != nil {
				break
			}
			resp.Body.Close()
			if time.Now().After(deadline) {
				t.Fatal("prometheus still answers 10 s after SIGSTOP")
			}
		}
		h := e.handler(t, func(c *status.Config) { c.Timeout = time.Second })
		start := time.Now()
		code, _, body := get(t, h, "/")
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("page took %v with a hanging Prometheus and a 1 s timeout", took)
		}
		if code != http.StatusOK {
			t.Fatalf("GET / = %d", code)
		}
		mustContain(t, "page", body, "Prometheus unreachable", usEast, euWest, "70.0%")
	})

	t.Run("stopped", func(t *testing.T) {
		if err := e.prom.Stop(); err != nil {
			t.Fatal(err)
		}
		h := e.handler(t, nil)
		code, _, body := get(t, h, "/")
		if code != http.StatusOK {
			t.Fatalf("GET / = %d, want 200 from PostgreSQL alone", code)
		}
		mustContain(t, "page", body, `id="prometheus-note"`, "Prometheus unreachable", usEast, euWest, "70.0%", "2 of 2",
			"50.0% → 70.0%", "pinned to eu-west during the migration")
		mustNotContain(t, "page", body, "connection refused", e.prom.URL())
		code, _, body = get(t, h, "/status.json")
		st := decodeStatus(t, body)
		if code != http.StatusOK || st.Prometheus.Reachable || !st.Prometheus.Configured || len(st.Prometheus.Unreachable) != 1 ||
			st.Regions[1].ThrottledRPS != nil || len(st.Changes) == 0 || len(st.Charts.Share[0].Points) != 0 {
			t.Errorf("status.json with Prometheus down: %d %s", code, body)
		}
	})
}

// TestPostgresUnreachable: without PostgreSQL the page is a 503 with a plain message and no
// internal error text; it recovers when the database is back.
func TestPostgresUnreachable(t *testing.T) {
	t.Parallel()
	pg := testenv.PostgresServer(t)
	dbURL, err := pg.CreateDatabase(t.Context(), "status")
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, dbURL)
	if err := st.AddRegion(t.Context(), usEast); err != nil {
		t.Fatal(err)
	}
	h, err := status.New(status.Config{Timeout: 2 * time.Second}, st)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, body := get(t, h, "/"); code != http.StatusOK || !strings.Contains(body, "No Prometheus configured") {
		t.Fatalf("GET / with PostgreSQL up = %d\n%s", code, body)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	leaks := []string{"127.0.0.1", fmt.Sprint(pg.Port), "dial", "refused", "connect:", "postgres://", "pgx", "SQLSTATE"}
	code, hdr, body := get(t, h, "/")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / with PostgreSQL down = %d %s, want 503 html", code, hdr.Get("Content-Type"))
	}
	mustContain(t, "503 page", body, "PostgreSQL unreachable", `role="alert"`)
	mustNotContain(t, "503 page", body, append(leaks, usEast)...)
	code, _, body = get(t, h, "/status.json")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"error": "PostgreSQL unreachable`) {
		t.Errorf("GET /status.json with PostgreSQL down = %d %s", code, body)
	}
	mustNotContain(t, "503 json", body, leaks...)

	if err := pg.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, body := get(t, h, "/")
		if code == http.StatusOK && strings.Contains(body, usEast) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("page did not recover within 20 s of PostgreSQL's restart: %d", code)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestEscaping: reasons and actors are operator text; the page shows them as text.
func TestEscaping(t *testing.T) {
	t.Parallel()
	st := openStore(t, testenv.PostgresDB(t))
	ctx := t.Context()
	for _, r := range []string{usEast, euWest} {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	script := `<script>alert("x")</script> moving traffic`
	if err := st.SetOverride(ctx, regions.GlobalScope, map[string]float64{usEast: 0.6, euWest: 0.4}, `<b>eve</b>`, script, 0); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteRebalancerShares(ctx, []store.ShareChange{{Scope: regions.Scope{Tenant: "shop-a", Route: "*"}, Region: usEast,
		New: 0.9, Reason: `"><img src=x onerror=alert(1)>`}}, job.ScopeInputs{Reason: `<svg onload=alert(2)>`, Kind: "run"}, "rebalancer"); err != nil {
		t.Fatal(err)
	}
	h, err := status.New(status.Config{}, st)
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := get(t, h, "/")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	mustContain(t, "page", body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; moving traffic`, `&lt;b&gt;eve&lt;/b&gt;`,
		`&#34;&gt;&lt;img src=x onerror=alert(1)&gt;`, `&lt;svg onload=alert(2)&gt;`, "No Prometheus configured")
	mustNotContain(t, "page", body, `<script>alert`, `<b>eve`, `<img src=x`, `<svg onload`)
	if n := strings.Count(body, "<script"); n != 1 {
		t.Errorf("%d script elements, want 1", n)
	}
	_, _, js := get(t, h, "/status.json")
	mustNotContain(t, "status.json", js, "<script", "<img")
	if st := decodeStatus(t, js); st.Regions[0].ShareReason != script || st.Changes[0].Reason == "" {
		t.Errorf("status.json does not round-trip the reason: %q", st.Regions[0].ShareReason)
	}
}

// TestDarkRegion: a region with no fresh heartbeat is dark; its gateways are listed as
// not live; with no stored share the regions split equally.
func TestDarkRegion(t *testing.T) {
	t.Parallel()
	st := openStore(t, testenv.PostgresDB(t))
	ctx := t.Context()
	for _, r := range []string{usEast, euWest} {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Heartbeat(ctx, "gw-1", usEast); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		skew     time.Duration
		liveUS   int
		darkUS   bool
		gwIsLive bool
	}{
		{name: "fresh", skew: 0, liveUS: 1, gwIsLive: true},
		{name: "after the ttl", skew: 2 * time.Minute, liveUS: 0, darkUS: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := status.New(status.Config{InstanceTTL: time.Minute, Now: func() time.Time { return time.Now().Add(tc.skew) }}, st)
			if err != nil {
				t.Fatal(err)
			}
			st, err := h.Collect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			eu, us := st.Regions[0], st.Regions[1]
			if !eu.Dark || eu.LiveGateways != 0 || len(eu.Gateways) != 0 {
				t.Errorf("eu-west has no gateway but %+v", eu)
			}
			if us.Dark != tc.darkUS || us.LiveGateways != tc.liveUS || len(us.Gateways) != 1 || us.Gateways[0].Live != tc.gwIsLive {
				t.Errorf("us-east %+v", us)
			}
			if us.Share != 0.5 || us.ShareSource != string(regions.SourceDefault) {
				t.Errorf("no stored share: %v %s, want an equal split", us.Share, us.ShareSource)
			}
			_, _, body := get(t, h, "/")
			mustContain(t, "page", body, `<span class="badge dark">dark</span>`, "No share has changed yet", "every tenant follows the default shares")
		})
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	st := &store.Store{}
	for _, tc := range []struct {
		name  string
		cfg   status.Config
		store status.Store
	}{
		{name: "no store"},
		{name: "source without api", cfg: status.Config{Prometheus: []status.Source{{Region: usEast}}}, store: st},
		{name: "bad source region", cfg: status.Config{Prometheus: []status.Source{{Region: "a b", API: promAPI(t, "http://127.0.0.1:1")}}}, store: st},
		{name: "short window", cfg: status.Config{RateWindow: time.Millisecond}, store: st},
		{name: "short chart", cfg: status.Config{ChartRange: time.Second}, store: st},
		{name: "negative top", cfg: status.Config{TopScopes: -1}, store: st},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := status.New(tc.cfg, tc.store); err == nil {
				t.Error("New accepted it")
			}
		})
	}
	if _, err := status.New(status.Config{}, st); err != nil {
		t.Errorf("zero config: %v", err)
	}
}

// TestAssetsSelfContained: nothing the page loads comes from another origin.
func TestAssetsSelfContained(t *testing.T) {
	t.Parallel()
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(`)
	xmlns := regexp.MustCompile(`xmlns="http://www\.w3\.org/2000/svg"`)
	for _, dir := range []string{"templates", "static"} {
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, f.Name()))
			if err != nil {
				t.Fatal(err)
			}
			b = xmlns.ReplaceAll(b, nil) // a namespace name, never fetched
			if m := external.Find(b); m != nil {
				t.Errorf("%s/%s references %q", dir, f.Name(), m)
			}
		}
	}
}

// TestCleanStopIsNotDark: a region whose only gateway stopped cleanly (restarting) is not
// dark on the page while that heartbeat is within the TTL, as for the rebalancer; the
// stopped gateway is no longer listed as live.
func TestCleanStopIsNotDark(t *testing.T) {
	t.Parallel()
	st := openStore(t, testenv.PostgresDB(t))
	ctx := t.Context()
	for _, r := range []string{usEast, euWest} {
		if err := st.AddRegion(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := st.Heartbeat(ctx, "gw-"+r, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RemoveInstance(ctx, "gw-"+euWest); err != nil {
		t.Fatal(err)
	}
	h, err := status.New(status.Config{InstanceTTL: time.Minute}, st)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if eu := s.Regions[0]; eu.Dark || eu.LiveGateways != 0 {
		t.Errorf("eu-west after a clean stop: %+v, want not dark with no live gateway", eu)
	}
}

// TestQuotasShown (#24): the page lists the calendar-quota periods running with the most
// usage, each region's usage beside the fleet's, most used first; an ended period (older
// than any running one) is left out.
func TestQuotasShown(t *testing.T) {
	t.Parallel()
	st := openStore(t, testenv.PostgresDB(t))
	seed(t, st)
	ctx := t.Context()
	now := time.Now()
	month := regions.Band{Name: "month", Capacity: 1000, Period: regions.PeriodMonth}
	start, _ := month.Window(now)
	k := func(tenant string, at time.Time) regions.QuotaKey {
		return regions.QuotaKey{Tenant: tenant, Route: "orders", Band: "month", Start: at.Unix()}
	}
	for region, rows := range map[string][]regions.QuotaReport{
		usEast: {{QuotaKey: k("acme", start), Used: 800}, {QuotaKey: k("small", start), Used: 3}},
		euWest: {{QuotaKey: k("acme", start), Used: 434}, {QuotaKey: k("old", start.AddDate(0, -3, 0)), Used: 99999}},
	} {
		if err := st.ReportUsage(ctx, region, rows); err != nil {
			t.Fatal(err)
		}
	}
	h, err := status.New(status.Config{InstanceTTL: time.Minute, Timeout: 3 * time.Second}, st)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.QuotasRead || len(s.Quotas) != 2 {
		t.Fatalf("quotas %+v (read %v), want acme's and small's", s.Quotas, s.QuotasRead)
	}
	// Regions are listed eu-west, us-east.
	if q := s.Quotas[0]; q.Tenant != "acme" || q.Used != 1234 || len(q.ByRegion) != 2 || q.ByRegion[0] != 434 || q.ByRegion[1] != 800 || !q.PeriodStart.Equal(start) {
		t.Errorf("first quota %+v, want acme's 1234 (eu-west 434, us-east 800) of the month from %v", q, start)
	}
	code, _, body := get(t, h, "/")
	if code != http.StatusOK || !strings.Contains(body, "Calendar quotas most used") || !strings.Contains(body, "<code>acme/orders</code>") || !strings.Contains(body, ">1234<") {
		t.Errorf("page %d does not show acme's quota:\n%s", code, body)
	}
}
