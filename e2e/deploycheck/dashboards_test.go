package deploycheck

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// metricSources are the packages that register quotaplane's metrics. The allow-list of
// metric names is every "ratelimit_..." string literal in their non-test Go files, so a
// renamed or removed metric breaks this test instead of an operator's dashboard.
var metricSources = []string{
	"../../gateway",
	"../../gateway/limiter",
	"../../rebalancer/job",
}

// registeredMetrics returns the allow-list.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	name := regexp.MustCompile(`^ratelimit_[a-z0-9_]+$`)
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, dir := range metricSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s: update metricSources", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if s, err := strconv.Unquote(lit.Value); err == nil && name.MatchString(s) {
					names[s] = true
				}
				return true
			})
		}
	}
	// The extraction itself must work: these are the contract (docs/configuration.md).
	for _, must := range []string{"ratelimit_requests_total", "ratelimit_fallback_active", "ratelimit_rebalancer_runs_total"} {
		if !names[must] {
			t.Fatalf("allow-list %v lacks %s: the extraction from %v is broken", names, must, metricSources)
		}
	}
	return names
}

// allowed reports whether a PromQL metric name is registered, counting the _bucket, _sum
// and _count series of a histogram.
func allowed(names map[string]bool, m string) bool {
	if names[m] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(m, suffix); ok && names[base] {
			return true
		}
	}
	return false
}

// PromQL words that are never metric names: operators, modifiers and the aggregations
// (which may be followed by "by (...)" rather than "(").
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

// metricNames returns the metric names a PromQL expression selects: identifiers outside
// label matchers, ranges, strings and label lists, that are not functions or keywords.
func metricNames(expr string) []string {
	var out []string
	skipTo := func(i int, open, close byte) int { // i is at open; returns the index after close
		depth := 0
		for ; i < len(expr); i++ {
			switch c := expr[i]; {
			case c == '"' || c == '\'' || c == '`':
				i = skipString(expr, i) - 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	nextNonSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{':
			i = skipTo(i, '{', '}')
		case c == '[':
			i = skipTo(i, '[', ']')
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') { // 0.99, 1e3, 5m
				i++
			}
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			j := nextNonSpace(i)
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				if j < len(expr) && expr[j] == '(' {
					i = skipTo(j, '(', ')') // a label list
				}
			case word == "offset":
				i = j
				for i < len(expr) && (isIdent(expr[i]) || expr[i] == '-') {
					i++
				}
			case promqlKeywords[word]:
			case j < len(expr) && expr[j] == '(':
				// a function or an aggregation
			default:
				out = append(out, word)
			}
		default:
			i++
		}
	}
	return out
}

// skipString returns the index after the string literal that starts at i.
func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s); i++ {
		if s[i] == '\\' && q != '`' {
			i++
			continue
		}
		if s[i] == q {
			return i + 1
		}
	}
	return i
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (region, le) (rate(a_bucket{x="y{z}", w=~"$region"}[1m]))`, []string{"a_bucket"}},
		{`histogram_quantile(0.99, b) / on (region) group_left (route) c offset 5m`, []string{"b", "c"}},
		{`time() - max(d) > bool 1e3 and e unless f`, []string{"d", "e", "f"}},
		{`sum(g) without (tenant) or topk(10, h{decision="throttled"})`, []string{"g", "h"}},
		{`label_values(i, region)`, []string{"i", "region"}},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}

func TestDashboardStructure(t *testing.T) {
	d, err := parse(dashboardJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal(dashboardJSON(t), &raw); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want 36 or later (data-source references by uid)", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v := vars["datasource"]; v.Type != "datasource" || v.Query != "prometheus" {
		t.Errorf("variable datasource: type %q query %v, want a prometheus data-source variable", v.Type, v.Query)
	}
	region := vars["region"]
	if region.Type != "query" || region.Datasource == nil || region.Datasource.UID != "${datasource}" {
		t.Errorf("variable region: want a query variable on ${datasource}, got %+v", region)
	}
	if region.Definition != "label_values(ratelimit_requests_total, region)" {
		t.Errorf("variable region: definition %q", region.Definition)
	}
	if q, ok := region.Query.(map[string]any); !ok || q["query"] != region.Definition {
		t.Errorf("variable region: query %v does not match its definition", region.Query)
	}
	if !region.Multi || !region.IncludeAll || region.AllValue != ".*" {
		t.Errorf("variable region: want multi, includeAll with allValue .*, got %+v", region)
	}

	panels := d.allPanels()
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	ids := map[int]string{}
	type rect struct{ x, y, w, h int }
	var placed []rect
	for _, p := range panels {
		t.Run(p.Title, func(t *testing.T) {
			if p.Title == "" {
				t.Error("no title")
			}
			if other, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("id %d is missing or also %q's", p.ID, other)
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				return
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
				t.Errorf("datasource %+v: want {prometheus ${datasource}}", p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Error("no targets")
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("target refId %q missing or repeated", tg.RefID)
				}
				refs[tg.RefID] = true
				if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("target %s: datasource %+v, want ${datasource}", tg.RefID, tg.Datasource)
				}
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("target %s: no expr", tg.RefID)
				}
				// With several regions selected $region is a|b, which only a regex matches.
				if n, m := strings.Count(tg.Expr, "$region"), strings.Count(tg.Expr, `region=~"$region"`); n != m {
					t.Errorf("target %s: $region used %d times, only %d as region=~\"$region\"", tg.RefID, n, m)
				}
			}
			g := p.GridPos
			r := rect{g.X, g.Y, g.W, g.H}
			if r.w <= 0 || r.h <= 0 || r.x < 0 || r.x+r.w > 24 {
				t.Errorf("gridPos %+v is outside the 24-column grid", g)
			}
			for _, o := range placed {
				if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
					t.Errorf("gridPos %+v overlaps another panel at %+v", g, o)
				}
			}
			placed = append(placed, r)
		})
	}
}

// The panels issue 7 asks for, each by a metric it must query.
func TestDashboardCoversIssue(t *testing.T) {
	qs, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	all := ""
	for _, q := range qs {
		all += q.Expr + "\n"
	}
	for what, re := range map[string]string{
		"allowed vs throttled":    `ratelimit_requests_total\{[^}]*decision=~"allowed\|throttled`,
		"throttle ratio":          `decision="throttled"\}\[1m\]\)\) / sum`,
		"gateway shares":          `ratelimit_region_share_ratio\{[^}]*scope="\*"`,
		"rebalancer shares":       `ratelimit_rebalancer_share_ratio\{[^}]*scope="\*"`,
		"fallback active":         `ratelimit_fallback_active`,
		"decision latency p99":    `histogram_quantile\(0\.99, sum by \(region, le\) \(rate\(ratelimit_decision_duration_seconds_bucket`,
		"top throttled tenants":   `topk\(10, [^\n]*ratelimit_tenant_requests_total\{[^}]*decision="throttled"`,
		"rebalancer runs":         `sum by \(result\) \([a-z]+\(ratelimit_rebalancer_runs_total`,
		"rebalancer last success": `time\(\) - max\(ratelimit_rebalancer_last_success_timestamp_seconds\)`,
	} {
		if !regexp.MustCompile(re).MatchString(all) {
			t.Errorf("no panel shows %s (no query matches %s)", what, re)
		}
	}
}

func TestQueriesUseRegisteredMetrics(t *testing.T) {
	names := registeredMetrics(t)
	qs, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) == 0 {
		t.Fatal("no queries")
	}
	d, err := parse(dashboardJSON(t))
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	for _, q := range qs {
		exprs[q.Panel+": "+q.Expr] = q.Expr
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			// label_values(METRIC, LABEL): only its first argument is a metric.
			if ms := metricNames(v.Definition); len(ms) > 0 {
				exprs["variable "+v.Name] = ms[0]
			}
		}
	}
	for where, expr := range exprs {
		ms := metricNames(expr)
		if len(ms) == 0 {
			t.Errorf("%s: selects no metric", where)
		}
		for _, m := range ms {
			if !allowed(names, m) {
				t.Errorf("%s: metric %s is not registered by %v", where, m, metricSources)
			}
		}
	}
}

func TestSubstitute(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: `rate(a{region=~"$region"}[$__rate_interval])`, want: `rate(a{region=~".*"}[1m])`},
		{in: `increase(a{region=~"${region}"}[${__range}])`, want: `increase(a{region=~".*"}[5m])`},
		{in: `rate(a[$__interval])`, want: `rate(a[15s])`},
		{in: `a{tenant="$tenant"}`, err: "$tenant"},
		{in: `rate(a[${__range_s}])`, err: "${__range_s}"},
	} {
		got, err := substitute(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("substitute(%q) error %v, want one naming %s", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("substitute(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := queries([]byte(`{"panels":[{"title":"x","targets":[{"refId":"A","expr":"a{r=\"$nope\"}"}]}]}`)); err == nil {
		t.Error("queries accepted an unknown variable")
	}
	if _, err := queries([]byte(`{"panels":[{"title":"x","targets":[{"refId":"A","expr":" "}]}]}`)); err == nil {
		t.Error("queries accepted an empty expr")
	}
}

// promResponse is the Prometheus HTTP API envelope.
type promResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	} `json:"data"`
}

func query(ctx context.Context, t *testing.T, base, expr string) (int, promResponse) {
	t.Helper()
	u := base + "/api/v1/query?" + url.Values{"query": {expr}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("query %q: %v", expr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r promResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("query %q: HTTP %d, not the API's JSON: %s", expr, resp.StatusCode, body)
	}
	return resp.StatusCode, r
}

// TestQueriesAcceptedByPrometheus runs every query on a real Prometheus with no targets:
// a query it cannot parse or evaluate is a 400 bad_data; a good one succeeds, empty.
func TestQueriesAcceptedByPrometheus(t *testing.T) {
	qs, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	prom := testenv.Prom(t, testenv.PrometheusOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The server does reject a bad query, so a success below means something.
	if code, r := query(ctx, t, prom.URL(), `sum by (region (rate(ratelimit_requests_total[1m]))`); code != http.StatusBadRequest || r.ErrorType != "bad_data" {
		t.Fatalf("a malformed query got HTTP %d %q, want 400 bad_data", code, r.ErrorType)
	}
	for _, q := range qs {
		code, r := query(ctx, t, prom.URL(), q.Expr)
		if code != http.StatusOK || r.Status != "success" {
			t.Errorf("panel %q: %s\nHTTP %d %s: %s", q.Panel, q.Expr, code, r.ErrorType, r.Error)
		}
	}
}

// dashboardJSON is the dashboard file's content.
func dashboardJSON(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(DashboardFile())
	if err != nil {
		t.Fatal(err)
	}
	return data
}
