package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Route is the stack's main route: any method on /orders, one token a request.
const Route = "orders"

// BulkRoute is the stack's costly route: any method on /bulk, BulkCost tokens a request
// (routes[].cost.fixed), for checks that a cost is never clipped into a cheaper pass.
const (
	BulkRoute = "bulk"
	BulkCost  = 5
)

// ValueRoute is the stack's per-value route: any method on /search, limited per value of
// the ValueHeader request header (limit_by header:X-User) inside the tenant's rule for it.
const (
	ValueRoute  = "search"
	ValueHeader = "X-User"
)

// IPRoute is the stack's per-client route: any method on /byip, limited per client
// address (limit_by client_ip) inside the tenant's rule for it.
const IPRoute = "byip"

// TrustedProxy is the one address whose X-Forwarded-For the gateways believe
// (trusted_proxies). Every client of the stack connects from 127.0.0.1, so a proxy in
// front of a gateway that binds its connections to this address (nginx's proxy_bind) is
// told apart from a client that forges the header.
const TrustedProxy = "127.0.0.2"

// TenantHeader is the header the gateways set to the authenticated tenant for the
// upstream. The echo service answers, besides it, every value it received under a name
// that folds (case, '_' for '-') to it: a client's forged copy that reached the upstream
// shows there.
const TenantHeader = "X-Tenant-Id"

// Echo is the echo service's JSON answer.
type Echo struct {
	OK     bool   `json:"ok"`
	Tenant string `json:"tenant"`
	// TenantHeaders are the values of every header whose name folds to TenantHeader.
	TenantHeaders []string `json:"tenant_headers"`
}

// Tenant is a tenant of the stack with its global rule on Route.
type Tenant struct {
	ID              string
	Capacity        int64
	RefillPerSecond float64
}

// Options configure Start; zero values take the defaults noted.
type Options struct {
	Regions           []string // default us-east, eu-west
	GatewaysPerRegion int      // default 2
	Tenants           []Tenant // default DemoTenants()
	// Rules are more rules (a tenant's or a route's default), written with the tenants,
	// before any gateway starts.
	Rules             []regions.Rule
	RebalanceInterval time.Duration // default 10s
	CheckInterval     time.Duration // default RebalanceInterval/2
	ScrapeInterval    time.Duration // default 1s
	// BinDir holds the built binaries; empty means a temporary directory.
	BinDir string
	Logger *slog.Logger
	// RedisFront, if set, is called with each region's Redis address once it runs and
	// returns the address the region's gateways dial instead (for example a
	// testenv.SlowProxy in front of it, for fault tests). Nil: the gateways dial Redis.
	RedisFront func(region, redisAddr string) (string, error)
	// GatewayRedisFront, if set, is called for each gateway before it starts with its
	// region's Redis address (RedisFront's when that is set) and returns the address
	// this one gateway dials instead: a proxy between one gateway and its Redis (a black
	// hole, added latency). Nil: the gateway dials the region's address.
	GatewayRedisFront func(gatewayID, region, redisAddr string) (string, error)
	// RedisTimeout is the gateways' redis.timeout (default 5ms).
	RedisTimeout time.Duration
	// QuotaSyncInterval is the gateways' quota_sync_interval, how stale a region's
	// count of the fleet's calendar-quota usage may be; zero leaves the gateway's
	// default (5s).
	QuotaSyncInterval time.Duration
}

// DemoTenants are the demo's tenants: one that shifts between regions above its limit,
// one well under its limit, and one hammering at three times its limit.
func DemoTenants() []Tenant {
	return []Tenant{
		{ID: "shop-a", Capacity: 200, RefillPerSecond: 100},
		{ID: "shop-b", Capacity: 200, RefillPerSecond: 100},
		{ID: "shop-c", Capacity: 40, RefillPerSecond: 20},
	}
}

// Gateway is one running gateway process.
type Gateway struct {
	Region string
	ID     string
	URL    string // the proxy, e.g. http://127.0.0.1:PORT; /v1/check is on it too
	Admin  string // the admin base URL: /metrics /healthz /readyz
	// RLS is the address (host:port) of its Envoy rate-limit service (rls_listen, gRPC).
	RLS     string
	Process *testenv.Process
}

// Stack is a running stack. Close stops everything and removes the temporary data.
type Stack struct {
	Regions  []string
	Postgres *testenv.Postgres
	// DatabaseURL is the owner's (it migrated the schema; Store and the tests' own
	// queries use it). The gateways and the rebalancer connect as login roles of their
	// components' group roles (migrations 00009), as a deployment does.
	DatabaseURL           string
	GatewayDatabaseURL    string
	RebalancerDatabaseURL string
	Store                 *store.Store
	Redis                 map[string]*testenv.Process
	// RedisURL is the Redis URL each region's gateways were given (Options.RedisFront's
	// address when set).
	RedisURL map[string]string
	// Gateways are the gateways Start started and AddGateway added, less those
	// RemoveGateway stopped. A program that adds or removes gateways while other
	// goroutines look at them reads them with GatewayList or GatewaysOf instead.
	Gateways   []*Gateway
	Upstream   string // the echo service's base URL
	Prometheus *testenv.Prometheus
	Rebalancer *testenv.Process
	// RebalancerAdmin is the rebalancer's admin base URL (status page, /metrics).
	RebalancerAdmin string
	// Keys maps a tenant to its API key secret.
	Keys map[string]string

	opts     Options
	dir      string
	bin      string
	upstream *http.Server
	// delayed counts the upstream's ?delay_ms requests still being answered.
	delayed atomic.Int64
	log     *slog.Logger

	mu   sync.Mutex     // guards Gateways and next once Start has returned
	next map[string]int // region -> the number of the next gateway AddGateway starts
	// scrapeMu makes each scrape-target update read the gateways and write them in one
	// step, so that concurrent AddGateway calls cannot write an older list last.
	scrapeMu sync.Mutex
}

// Start builds the binaries and starts the whole stack; on error, whatever was started is
// stopped again.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if len(opts.Regions) == 0 {
		opts.Regions = []string{"us-east", "eu-west"}
	}
	if opts.GatewaysPerRegion <= 0 {
		opts.GatewaysPerRegion = 2
	}
	if len(opts.Tenants) == 0 {
		opts.Tenants = DemoTenants()
	}
	if opts.RebalanceInterval <= 0 {
		opts.RebalanceInterval = 10 * time.Second
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = opts.RebalanceInterval / 2
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = time.Second
	}
	if opts.RedisTimeout <= 0 {
		opts.RedisTimeout = 5 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	dir, err := os.MkdirTemp("", "quotaplane-stack-*")
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	s := &Stack{Regions: opts.Regions, Redis: map[string]*testenv.Process{}, RedisURL: map[string]string{}, Keys: map[string]string{}, opts: opts, dir: dir, log: opts.Logger, next: map[string]int{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	bin := opts.BinDir
	if bin == "" {
		bin = filepath.Join(dir, "bin")
	}
	s.bin = bin
	s.log.Info("building binaries", "dir", bin)
	if err := Build(ctx, bin); err != nil {
		return nil, err
	}
	if err := s.startData(ctx); err != nil {
		return nil, err
	}
	if err := s.startUpstream(); err != nil {
		return nil, err
	}
	for _, region := range opts.Regions {
		for range opts.GatewaysPerRegion {
			g, err := s.startGateway(ctx, region)
			if err != nil {
				return nil, err
			}
			s.Gateways = append(s.Gateways, g)
		}
	}
	if err := s.startPrometheus(ctx); err != nil {
		return nil, err
	}
	if err := s.startRebalancer(ctx, bin); err != nil {
		return nil, err
	}
	return s, nil
}

// Build compiles cmd/gateway and cmd/rebalancer into dir.
func Build(ctx context.Context, dir string) error {
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(os.PathSeparator), "./cmd/gateway", "./cmd/rebalancer")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build binaries: %w\n%s", err, out)
	}
	return nil
}

func (s *Stack) startData(ctx context.Context) error {
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return err
	}
	s.Postgres = pg
	if s.DatabaseURL, err = pg.CreateDatabase(ctx, "quotaplane"); err != nil {
		return err
	}
	if s.Store, err = store.Open(ctx, s.DatabaseURL); err != nil {
		return err
	}
	if err := s.Store.Migrate(ctx); err != nil {
		return err
	}
	if s.GatewayDatabaseURL, err = testenv.CreateLoginRole(ctx, s.DatabaseURL, "stack_gateway", migrations.RoleGateway); err != nil {
		return err
	}
	if s.RebalancerDatabaseURL, err = testenv.CreateLoginRole(ctx, s.DatabaseURL, "stack_rebalancer", migrations.RoleRebalancer); err != nil {
		return err
	}
	actx := store.WithAudit(ctx, "stack", "local stack setup")
	for _, r := range s.opts.Regions {
		if err := s.Store.AddRegion(actx, r); err != nil {
			return err
		}
		rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(s.dir, "redis-"+r)})
		if err != nil {
			return err
		}
		s.Redis[r] = rd
		s.RedisURL[r] = testenv.RedisURL(rd)
		if s.opts.RedisFront != nil {
			addr, err := s.opts.RedisFront(r, rd.Addr())
			if err != nil {
				return fmt.Errorf("redis front of %s: %w", r, err)
			}
			s.RedisURL[r] = "redis://" + addr + "/0"
		}
	}
	for _, t := range s.opts.Tenants {
		if err := s.Store.SetRule(actx, regions.Rule{Tenant: t.ID, Route: Route, Capacity: t.Capacity, RefillPerSecond: t.RefillPerSecond, Shards: 1}); err != nil {
			return err
		}
		secret, _, err := s.Store.CreateKey(actx, t.ID, "stack")
		if err != nil {
			return err
		}
		s.Keys[t.ID] = secret
	}
	for _, r := range s.opts.Rules {
		if err := s.Store.SetRule(actx, r); err != nil {
			return err
		}
	}
	return nil
}

// UpstreamDelayed is how many ?delay_ms requests the upstream is answering now: the
// requests a gateway admitted and still has in flight.
func (s *Stack) UpstreamDelayed() int { return int(s.delayed.Load()) }

func (s *Stack) startUpstream() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	s.upstream = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ?delay_ms=N (at most 5000) answers late: in-flight requests for drain tests.
		if ms, err := strconv.Atoi(r.URL.Query().Get("delay_ms")); err == nil && ms > 0 {
			s.delayed.Add(1)
			defer s.delayed.Add(-1)
			select {
			case <-time.After(time.Duration(min(ms, 5000)) * time.Millisecond):
			case <-r.Context().Done():
			}
		}
		e := Echo{OK: true, Tenant: r.Header.Get(TenantHeader), TenantHeaders: []string{}}
		for name, vs := range r.Header {
			if strings.EqualFold(strings.ReplaceAll(name, "_", "-"), TenantHeader) {
				e.TenantHeaders = append(e.TenantHeaders, vs...)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(e)
	})}
	go func() { _ = s.upstream.Serve(ln) }()
	s.Upstream = "http://" + ln.Addr().String()
	return nil
}

// gatewayConfig is a gateway's YAML file; %s/%d placeholders filled by startGateway.
const gatewayConfig = `region: %s
instance_id: %s
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
database_url: %q
redis:
  url: %q
  timeout: %s
rls_listen: 127.0.0.1:%d
reload_interval: 5s
heartbeat_interval: 1s
expected_instances: %d
log_level: info
trusted_proxies: [%q]
routes:
  - id: %s
    match: "/orders"
    upstream: %q
  - id: %s
    match: "/bulk"
    upstream: %q
    cost:
      fixed: %d
  - id: %s
    match: "/search"
    upstream: %q
    limit_by: "header:%s"
  - id: %s
    match: "/byip"
    upstream: %q
    limit_by: client_ip
`

// startGateway starts the next gateway of region (ids region-1, region-2, ...; a number
// is never used twice) and waits until it is ready. It does not add it to Gateways.
func (s *Stack) startGateway(ctx context.Context, region string) (*Gateway, error) {
	// A port free a moment ago can be taken before the gateway binds it: the outgoing
	// connections of the load draw their source ports from the same ephemeral range
	// (seen once in CI: "admin listen: ... address already in use" at a scale-out). Such
	// a start is tried again with fresh ports, at most twice more.
	for try := 0; ; try++ {
		g, err := s.startGatewayOnce(ctx, region)
		if err == nil || try == 2 || !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
			return g, err
		}
		s.log.Warn("gateway port taken before it was bound; starting it again on other ports", "region", region, "err", err)
	}
}

func (s *Stack) startGatewayOnce(ctx context.Context, region string) (*Gateway, error) {
	s.mu.Lock()
	s.next[region]++
	id := fmt.Sprintf("%s-%d", region, s.next[region])
	s.mu.Unlock()
	dir := filepath.Join(s.dir, "gateway-"+id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("gateway %s: %w", id, err)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, fmt.Errorf("gateway %s: %w", id, err)
	}
	port, admin, rls := ports[0], ports[1], ports[2]
	redisURL := s.RedisURL[region]
	if s.opts.GatewayRedisFront != nil {
		addr, err := s.opts.GatewayRedisFront(id, region, strings.TrimSuffix(strings.TrimPrefix(redisURL, "redis://"), "/0"))
		if err != nil {
			return nil, fmt.Errorf("gateway %s: redis front: %w", id, err)
		}
		redisURL = "redis://" + addr + "/0"
	}
	cfg := fmt.Sprintf(gatewayConfig, region, id, port, admin, s.GatewayDatabaseURL, redisURL, s.opts.RedisTimeout, rls, s.opts.GatewaysPerRegion, TrustedProxy,
		Route, s.Upstream, BulkRoute, s.Upstream, BulkCost, ValueRoute, s.Upstream, ValueHeader, IPRoute, s.Upstream)
	if iv := s.opts.QuotaSyncInterval; iv > 0 {
		cfg += fmt.Sprintf("quota_sync_interval: %s\n", iv)
	}
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return nil, fmt.Errorf("gateway %s: %w", id, err)
	}
	adminURL := "http://127.0.0.1:" + strconv.Itoa(admin)
	p, err := testenv.StartCommand(ctx, testenv.Command{
		Name: "gateway", Path: filepath.Join(s.bin, "gateway"), Args: []string{"--config", path},
		Dir: dir, Port: port, Ready: testenv.HTTPReady(adminURL + "/readyz"),
	})
	if err != nil {
		return nil, fmt.Errorf("gateway %s: %w", id, err)
	}
	g := &Gateway{Region: region, ID: id, URL: "http://127.0.0.1:" + strconv.Itoa(port), Admin: adminURL, RLS: "127.0.0.1:" + strconv.Itoa(rls), Process: p}
	s.log.Info("gateway ready", "region", region, "id", id, "url", g.URL)
	return g, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago: all n are
// held open until each is known, so none is handed out twice.
func freePorts(n int) ([]int, error) {
	out := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer ln.Close()
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// AddGateway starts one more gateway in region, as a scale-out does, waits until it is
// ready, adds it to Gateways and to Prometheus's scrape targets, and returns it. It is
// safe to call while other goroutines use the stack.
func (s *Stack) AddGateway(ctx context.Context, region string) (*Gateway, error) {
	if _, ok := s.Redis[region]; !ok {
		return nil, fmt.Errorf("add gateway: no region %q in the stack", region)
	}
	g, err := s.startGateway(ctx, region)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.Gateways = append(s.Gateways, g)
	s.mu.Unlock()
	if err := s.refreshScrape(ctx); err != nil {
		return g, fmt.Errorf("add gateway %s: scrape targets: %w", g.ID, err)
	}
	return g, nil
}

// RemoveGateway stops gateway id gracefully (SIGTERM: it drains and deletes its
// heartbeat row), as a scale-in does, and removes it from Gateways and from
// Prometheus's scrape targets. The process's log stays readable (Process.LogPath) until
// Close. It is safe to call while other goroutines use the stack.
func (s *Stack) RemoveGateway(ctx context.Context, id string) (*Gateway, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.Gateways, func(g *Gateway) bool { return g.ID == id })
	if i < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("remove gateway: no gateway %q", id)
	}
	g := s.Gateways[i]
	s.Gateways = slices.Delete(slices.Clone(s.Gateways), i, i+1)
	s.mu.Unlock()
	if err := g.Process.Stop(); err != nil {
		return g, fmt.Errorf("remove gateway %s: %w", id, err)
	}
	if err := s.refreshScrape(ctx); err != nil {
		return g, fmt.Errorf("remove gateway %s: scrape targets: %w", id, err)
	}
	return g, nil
}

// refreshScrape points Prometheus at the gateways now in Gateways.
func (s *Stack) refreshScrape(ctx context.Context) error {
	s.scrapeMu.Lock()
	defer s.scrapeMu.Unlock()
	return s.Prometheus.SetJobs(ctx, s.ScrapeJobs())
}

// GatewayList is a copy of Gateways, taken under the lock AddGateway and RemoveGateway
// hold.
func (s *Stack) GatewayList() []*Gateway {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.Gateways)
}

// ScrapeJobs is what Prometheus scrapes: the gateways (one target group per region, with
// a region label) and the rebalancer.
func (s *Stack) scrapeJobs(rebalancerAdmin string) []testenv.ScrapeJob {
	gw := testenv.ScrapeJob{Name: "gateway"}
	all := s.GatewayList()
	for _, r := range s.Regions {
		g := testenv.TargetGroup{Labels: map[string]string{"region": r}}
		for _, x := range all {
			if x.Region == r {
				g.Targets = append(g.Targets, strings.TrimPrefix(x.Admin, "http://"))
			}
		}
		gw.Groups = append(gw.Groups, g)
	}
	jobs := []testenv.ScrapeJob{gw}
	if rebalancerAdmin != "" {
		jobs = append(jobs, testenv.ScrapeJob{Name: "rebalancer", Targets: []string{strings.TrimPrefix(rebalancerAdmin, "http://")}})
	}
	return jobs
}

func (s *Stack) startPrometheus(ctx context.Context) error {
	root, err := testenv.ModuleRoot(ctx)
	if err != nil {
		return err
	}
	p, err := testenv.StartPrometheus(ctx, testenv.PrometheusOptions{
		Dir: filepath.Join(s.dir, "prometheus"), ScrapeInterval: s.opts.ScrapeInterval,
		Jobs:      s.scrapeJobs(""),
		RuleFiles: []string{filepath.Join(root, "deploy", "prometheus", "rules.yml")},
	})
	if err != nil {
		return err
	}
	s.Prometheus = p
	return nil
}

func (s *Stack) startRebalancer(ctx context.Context, bin string) error {
	admin, err := testenv.FreePort()
	if err != nil {
		return err
	}
	s.RebalancerAdmin = "http://127.0.0.1:" + strconv.Itoa(admin)
	iv := s.opts.RebalanceInterval
	p, err := testenv.StartCommand(ctx, testenv.Command{
		Name: "rebalancer", Path: filepath.Join(bin, "rebalancer"),
		Args: []string{
			"--prometheus-url", s.Prometheus.URL(),
			"--interval", iv.String(), "--check-interval", s.opts.CheckInterval.String(),
			"--short-window", iv.String(), "--reload-wait", "1s", "--instance-ttl", "3s",
			"--admin-listen", "127.0.0.1:" + strconv.Itoa(admin), "--log-level", "info",
		},
		Env:  []string{"RATELIMIT_DATABASE_URL=" + s.RebalancerDatabaseURL},
		Dir:  filepath.Join(s.dir, "rebalancer"),
		Port: admin, Ready: testenv.HTTPReady(s.RebalancerAdmin + "/healthz"),
	})
	if err != nil {
		return fmt.Errorf("rebalancer: %w", err)
	}
	s.Rebalancer = p
	return s.Prometheus.SetJobs(ctx, s.scrapeJobs(s.RebalancerAdmin))
}

// ScrapeJobs is the Prometheus scrape configuration the stack runs with (every gateway,
// grouped by region, and the rebalancer), for a test that changes it with SetJobs and
// wants to restore it.
func (s *Stack) ScrapeJobs() []testenv.ScrapeJob { return s.scrapeJobs(s.RebalancerAdmin) }

// GatewaysOf lists the gateways of one region.
func (s *Stack) GatewaysOf(region string) []*Gateway {
	var out []*Gateway
	for _, g := range s.GatewayList() {
		if g.Region == region {
			out = append(out, g)
		}
	}
	return out
}

// Close stops everything in reverse order and removes the temporary data.
func (s *Stack) Close() {
	if s.Rebalancer != nil {
		_ = s.Rebalancer.Stop()
	}
	if s.Prometheus != nil {
		_ = s.Prometheus.Stop()
	}
	for _, g := range s.GatewayList() {
		_ = g.Process.Stop()
	}
	if s.upstream != nil {
		_ = s.upstream.Close()
	}
	for _, r := range s.Redis {
		_ = r.Kill()
	}
	if s.Store != nil {
		s.Store.Close()
	}
	if s.Postgres != nil {
		_ = s.Postgres.Stop()
		_ = s.Postgres.Remove()
	}
	_ = os.RemoveAll(s.dir)
}
