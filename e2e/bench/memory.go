package bench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// redisMemory is one run's Redis measurement.
type redisMemory struct {
	typical, longest int64             // MEMORY USAGE of one bucket
	perBucket        map[int64]float64 // buckets -> used_memory delta per bucket
}

// bucketCounts are the sizes at which Redis memory is read.
func (b *bench) bucketCounts() []int64 {
	if b.opts.quick {
		return []int64{10_000, 20_000}
	}
	return []int64{100_000, 1_000_000}
}

// redisMemoryRun fills a fresh Redis with buckets as the gateway writes them (one
// token taken with a slow refill, so none expires during the run) and reads used_memory
// at each size.
func (b *bench) redisMemoryRun(ctx context.Context, run int) error {
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(b.work, fmt.Sprintf("redis-memory-%d", run))})
	if err != nil {
		return err
	}
	defer rd.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	defer rdb.Close()
	if err := loadScripts(ctx, rdb); err != nil {
		return fmt.Errorf("redis memory: %w", err)
	}
	const capacity, refill = 100, 0.01 // 100 s to refill one token: a TTL of 200 s
	m := redisMemory{perBucket: map[int64]float64{}}
	for i, k := range []struct{ tenant, route string }{
		{"tenant-000001", "create-order"},
		{strings.Repeat("t", 64), strings.Repeat("r", 64)},
	} {
		usage, err := memoryUsage(ctx, rdb, k.tenant, k.route, capacity, refill)
		if err != nil {
			return fmt.Errorf("redis memory: %w", err)
		}
		if i == 0 {
			m.typical = usage
		} else {
			m.longest = usage
		}
	}
	before, err := usedMemory(ctx, rdb)
	if err != nil {
		return err
	}
	var filled int64
	for _, n := range b.bucketCounts() {
		const batch = 1000
		for ; filled < n; filled += batch {
			pipe := rdb.Pipeline()
			cmds := make([]*memoryCall, 0, batch)
			for j := filled; j < filled+batch; j++ {
				c := memoryBucket(ctx, fmt.Sprintf("tenant-%07d", j), "create-order", capacity, refill)
				_ = pipe.Process(ctx, c.Cmd)
				cmds = append(cmds, c)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("redis memory: fill: %w", err)
			}
			for _, c := range cmds {
				if err := memoryBucketOK(c); err != nil {
					return fmt.Errorf("redis memory: fill: %w", err)
				}
			}
		}
		if got := rdb.DBSize(ctx).Val(); got != keysPerBucket*n {
			return fmt.Errorf("redis memory: DBSIZE %d, want %d: %d keys per bucket (did buckets expire?)", got, keysPerBucket*n, keysPerBucket)
		}
		after, err := usedMemory(ctx, rdb)
		if err != nil {
			return err
		}
		m.perBucket[n] = float64(after-before) / float64(n)
	}
	b.rep.redisMem = append(b.rep.redisMem, m)
	b.logf("redis memory run %d: MEMORY USAGE %d / %d bytes, per bucket %v", run+1, m.typical, m.longest, m.perBucket)
	return nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory")
}

// gatewayMemory is the control-plane scale: tenants, keys, and what they cost a gateway.
type gatewayMemory struct {
	tenants, keys int
	seed          time.Duration   // COPY of rules and keys
	loads         []time.Duration // LoadSnapshot, warm
	rules         int             // RuleCount of the loaded snapshot
	baseRSS       int64           // a gateway with one tenant
	rss, hwm      int64           // the gateway with every tenant and key
	heap, baseHp  float64         // go_memstats_heap_inuse_bytes of each
	ready         time.Duration   // process start to /readyz (includes the first load)
	reload        time.Duration   // a rule change (NOTIFY) to the gateway's reloaded snapshot
	rssReload     int64           // RSS after that reload
	hwmReload     int64           // peak RSS through it
}

// gatewayMemory fills a PostgreSQL with 100k tenants (one rule each) and 1M API keys by
// COPY, times Store.LoadSnapshot, and reads the RSS of a gateway in database mode that
// has them loaded, next to one with a single tenant.
func (b *bench) gatewayMemory(ctx context.Context) error {
	gm := &gatewayMemory{tenants: 100_000, keys: 1_000_000}
	if b.opts.quick {
		gm.tenants, gm.keys = 1_000, 10_000
	}
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		return err
	}
	defer func() {
		_ = pg.Stop()
		_ = pg.Remove()
	}()
	echoProc, upstream, err := b.startEcho(ctx, "echo-memory")
	if err != nil {
		return err
	}
	defer echoProc.Kill()

	open := func(name string) (*store.Store, string, error) {
		url, err := pg.CreateDatabase(ctx, name)
		if err != nil {
			return nil, "", err
		}
		st, err := store.Open(ctx, url)
		if err != nil {
			return nil, "", err
		}
		if err := st.Migrate(ctx); err != nil {
			st.Close()
			return nil, "", err
		}
		if err := st.AddRegion(store.WithAudit(ctx, "bench", "benchmark data"), "bench"); err != nil {
			st.Close()
			return nil, "", err
		}
		return st, url, nil
	}
	small, smallURL, err := open("bench_small")
	if err != nil {
		return err
	}
	defer small.Close()
	if err := seed(ctx, small, 1, 1); err != nil {
		return err
	}
	big, bigURL, err := open("bench_big")
	if err != nil {
		return err
	}
	defer big.Close()
	start := time.Now()
	if err := seed(ctx, big, gm.tenants, gm.keys); err != nil {
		return err
	}
	gm.seed = time.Since(start)
	b.logf("memory: %d rules and %d keys copied in %s", gm.tenants, gm.keys, gm.seed.Round(time.Millisecond))

	for i := range b.opts.runs + 1 { // the first load warms PostgreSQL's cache
		start := time.Now()
		s, err := big.LoadSnapshot(ctx, time.Minute)
		if err != nil {
			return err
		}
		if i > 0 {
			gm.loads = append(gm.loads, time.Since(start))
		}
		gm.rules = s.RuleCount()
	}
	b.logf("memory: LoadSnapshot %v (%d rules)", gm.loads, gm.rules)

	for _, g := range []struct {
		name, url, key string
		big            bool
	}{{"gw-mem-small", smallURL, "key-0000000", false}, {"gw-mem-big", bigURL, fmt.Sprintf("key-%07d", gm.keys-1), true}} {
		start := time.Now()
		p, err := b.startGateway(ctx, gatewaySpec{name: g.name, database: g.url, upstream: upstream})
		if err != nil {
			return err
		}
		ready := time.Since(start)
		rss, hwm, heap, err := gatewayFootprint(ctx, p, g.key)
		if err == nil && g.big {
			gm.rss, gm.hwm, gm.heap, gm.ready = rss, hwm, heap, ready
			err = b.reloadFootprint(ctx, p, big, gm)
		}
		_ = p.proc.Stop()
		if err != nil {
			return err
		}
		if !g.big {
			gm.baseRSS, gm.baseHp = rss, heap
		}
		b.logf("memory: %s RSS %.1f MB (peak %.1f MB), heap in use %.1f MB, ready in %s", g.name, float64(rss)/1e6, float64(hwm)/1e6, heap/1e6, ready.Round(time.Millisecond))
	}
	b.rep.gatewayMem = gm
	return nil
}

// reloadFootprint changes one rule (NOTIFY), waits until the gateway has reloaded the
// whole snapshot, and reads its RSS and peak RSS again: a reload holds the old and the
// new snapshot at once.
func (b *bench) reloadFootprint(ctx context.Context, p *gatewayProc, st *store.Store, gm *gatewayMemory) error {
	const gauge = "ratelimit_rules_last_reload_success_timestamp_seconds"
	m, err := p.metrics(ctx)
	if err != nil {
		return err
	}
	loaded := m.sum(gauge)
	start := time.Now()
	rule := regions.Rule{Tenant: "t0000000", Route: benchRoute, Capacity: 11, RefillPerSecond: 1}
	if err := st.SetRule(store.WithAudit(ctx, "bench", "trigger a reload"), rule); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m, err = p.metrics(ctx); err != nil {
			return err
		}
		if m.sum(gauge) != loaded {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("memory: gateway %s did not reload within 30 s of a rule change", p.name)
		}
		time.Sleep(50 * time.Millisecond) // polling a real process for an eventual state
	}
	gm.reload = time.Since(start)
	pid, err := p.pid()
	if err != nil {
		return err
	}
	gm.rssReload, gm.hwmReload, err = procStatus(pid)
	b.logf("memory: rule change to reloaded snapshot in %s; RSS %.1f MB, peak %.1f MB", gm.reload.Round(time.Millisecond), float64(gm.rssReload)/1e6, float64(gm.hwmReload)/1e6)
	return err
}

// gatewayFootprint checks that the gateway knows key (its last key: every key was
// loaded), then reads its RSS, peak RSS and Go heap in use.
func gatewayFootprint(ctx context.Context, p *gatewayProc, key string) (rss, hwm int64, heap float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/orders", nil)
	if err != nil {
		return 0, 0, 0, err
	}
	req.Header.Set("X-Api-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("gateway %s: %w", p.name, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, 0, 0, fmt.Errorf("gateway %s: %s answered %d, want 200 (not every key loaded?)", p.name, key, res.StatusCode)
	}
	pid, err := p.pid()
	if err != nil {
		return 0, 0, 0, err
	}
	if rss, hwm, err = procStatus(pid); err != nil {
		return 0, 0, 0, err
	}
	m, err := p.metrics(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	return rss, hwm, m.sum("go_memstats_heap_inuse_bytes"), nil
}

// seed copies tenants rules (tenant t0000000..., route "orders") and keys API keys
// ("key-0000000"..., of tenant i mod tenants) into the store's database with COPY. The
// audit and notify triggers are bypassed (session_replication_role = replica), as a
// bulk import would.
func seed(ctx context.Context, st *store.Store, tenants, keys int) error {
	tx, err := st.Pool().Begin(ctx)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	tenant := func(i int) string { return fmt.Sprintf("t%07d", i) }
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"rate_limit_rule"}, []string{"tenant_id", "route_id", "capacity", "refill_per_second"},
		pgx.CopyFromSlice(tenants, func(i int) ([]any, error) {
			return []any{tenant(i), benchRoute, int64(10 + i%100), float64(1 + i%7)}, nil
		})); err != nil {
		return fmt.Errorf("seed: copy rules: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"api_key"}, []string{"key_hash", "tenant_id", "label"},
		pgx.CopyFromSlice(keys, func(i int) ([]any, error) {
			h := regions.HashKey(fmt.Sprintf("key-%07d", i))
			return []any{h[:], tenant(i % tenants), "bench"}, nil
		})); err != nil {
		return fmt.Errorf("seed: copy keys: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

// localMemory re-measures gateway/limiter's figures for the in-memory buckets (the
// fallback and the standalone limiter): heap per bucket and idle eviction.
func (b *bench) localMemory(ctx context.Context) error {
	r := testRun{pkg: "limiter", timeout: 2 * time.Minute, args: []string{
		"-test.run=^(TestLocalMemoryPerBucket|TestLocalIdleEvictionBoundsMemory)$", "-test.v", "-test.count=1",
	}}
	out, err := b.runTest(ctx, r)
	if err != nil {
		return err
	}
	perBucket := regexp.MustCompile(`(\d+) live buckets: ([\d.]+) MB, ([\d.]+) bytes per bucket`).FindSubmatch(out)
	idle := regexp.MustCompile(`(\d+) keys, (\d+) live at a time: peak (\d+) buckets`).FindSubmatch(out)
	if perBucket == nil || idle == nil {
		return fmt.Errorf("%s: log lines not found in\n%s", r.command(), tail(out, 2000))
	}
	b.rep.local = &localMemory{
		buckets: atoi(perBucket[1]), mb: atof(perBucket[2]), perBucket: atof(perBucket[3]),
		keys: atoi(idle[1]), live: atoi(idle[2]), peak: atoi(idle[3]),
		command: r.command(),
	}
	return nil
}

type localMemory struct {
	buckets       int64
	mb, perBucket float64
	keys, live    int64
	peak          int64
	command       string
}

func atoi(b []byte) int64 {
	v, _ := strconv.ParseInt(string(b), 10, 64)
	return v
}

func atof(b []byte) float64 {
	v, _ := strconv.ParseFloat(string(b), 64)
	return v
}
