package bench

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/e2e/bench/results"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// The script phase: the Redis ceiling of each script with nothing but a load generator
// in front of it, on one redis-server, the rows side by side in every run. The
// generator is testenv.Blast, redis-benchmark's -c and -P for commands redis-benchmark
// cannot send (ours has a binary argument), for every row alike: commands built before
// the clock starts, cycled through, so the client does little more than copy bytes.

// scriptCall is one script call: the script's text (SCRIPT LOAD, then EVALSHA by its
// SHA1), and the keys and arguments of one call, where a random number below the
// phase's key count goes for every randKey; or, for a script of binary arguments
// (ours), binary, which builds one call's keys and argument.
type scriptCall struct {
	name, origin string
	source       string
	keys, args   []string
	binary       func(r *rand.Rand, keys int) ([]string, []byte)
	decisions    int // decisions one call takes
}

// randKey is the placeholder of a random key number in keys.
const randKey = "__rand_int__"

// command is one EVALSHA of c with random keys, RESP-encoded.
func (c scriptCall) command(r *rand.Rand, keys int) []byte {
	args := [][]byte{[]byte("EVALSHA"), []byte(c.sha())}
	if c.binary != nil {
		ks, arg := c.binary(r, keys)
		args = append(args, []byte(strconv.Itoa(len(ks))))
		for _, k := range ks {
			args = append(args, []byte(k))
		}
		return testenv.RESPCommand(append(args, arg)...)
	}
	args = append(args, []byte(strconv.Itoa(len(c.keys))))
	for _, k := range c.keys {
		args = append(args, []byte(strings.ReplaceAll(k, randKey, strconv.Itoa(r.IntN(keys)))))
	}
	for _, a := range c.args {
		args = append(args, []byte(a))
	}
	return testenv.RESPCommand(args...)
}

// The rule of every script's calls: so large a capacity that every call admits, and so
// runs its whole script, and a refill at which every script writes. At a refill of 10^9
// per second redis_rate's GCRA step (10^-9 s) is below the precision of its clock
// (seconds since 2017 in a double: about 6e-8 s), so its SET was skipped and its row
// compared a script that only reads with ours, which writes (docs/engine-profile.md).
const (
	ceilingCapacity = 1_000_000_000
	ceilingRefill   = 1_000_000
)

func (c scriptCall) sha() string {
	h := sha1.Sum([]byte(c.source))
	return hex.EncodeToString(h[:])
}

// articleScript is the token bucket of the design's source article, section 6.2,
// verbatim.
const articleScript = `local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local refillMs = tonumber(ARGV[2]) / 1000.0 -- tokens por ms
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local data = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(data[1]) or capacity
local ts = tonumber(data[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * refillMs)
local allowed = 0
if tokens >= 1 then
tokens = tokens - 1
allowed = 1
end
redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', key, math.ceil(capacity / refillMs) * 2)
return { allowed, math.floor(tokens) }
`

// articleBatchScript is the article's logic looped over every key of one call (one
// TIME for the call), replying allowed and remaining per key.
const articleBatchScript = `local capacity = tonumber(ARGV[1])
local refillMs = tonumber(ARGV[2]) / 1000.0
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local data = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(data[1]) or capacity
  local ts = tonumber(data[2]) or now
  tokens = math.min(capacity, tokens + math.max(0, now - ts) * refillMs)
  local allowed = 0
  if tokens >= 1 then
    tokens = tokens - 1
    allowed = 1
  end
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', now)
  redis.call('PEXPIRE', key, math.ceil(capacity / refillMs) * 2)
  out[2 * i - 1] = allowed
  out[2 * i] = math.floor(tokens)
end
return out
`

func articleCall() scriptCall {
	return scriptCall{name: "article", origin: "the article, section 6.2, verbatim", source: articleScript,
		keys: []string{"article:{" + randKey + "}:create-order"}, args: rule2(), decisions: 1}
}

// articleBatch is n decisions of the article's logic in one call, on n random keys.
func articleBatch(n int) scriptCall {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "article:{" + randKey + "}:create-order"
	}
	return scriptCall{name: "article-batch", origin: fmt.Sprintf("the article's logic looped over the %d keys of one call", n),
		source: articleBatchScript, keys: keys, args: rule2(), decisions: n}
}

func rule2() []string {
	return []string{strconv.Itoa(ceilingCapacity), strconv.Itoa(ceilingRefill)}
}

// redisRateCall is go-redis/redis_rate's GCRA script (the allowN of the module version
// in go.mod, read from its source, so none of its code is copied here) as its Allow
// calls it: key "rate:" + key; burst, rate, period in seconds, cost.
func redisRateCall(ctx context.Context, root string) (scriptCall, error) {
	const module = "github.com/go-redis/redis_rate/v10"
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", module)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return scriptCall{}, fmt.Errorf("go list -m %s: %w", module, err)
	}
	dir, version, ok := strings.Cut(strings.TrimSpace(string(out)), " ")
	if !ok || dir == "" {
		return scriptCall{}, fmt.Errorf("go list -m %s: %q: module source not downloaded (go mod download %s)", module, out, module)
	}
	src, err := os.ReadFile(filepath.Join(dir, "lua.go"))
	if err != nil {
		return scriptCall{}, fmt.Errorf("redis_rate's script: %w", err)
	}
	m := regexp.MustCompile("(?s)var allowN = redis.NewScript\\(`(.*?)`\\)").FindSubmatch(src)
	if m == nil {
		return scriptCall{}, fmt.Errorf("redis_rate's script: no allowN = redis.NewScript(`...`) in %s/lua.go", dir)
	}
	return scriptCall{name: "redis_rate", origin: fmt.Sprintf("`allowN` of %s %s (GCRA)", module, version), source: string(m[1]),
		keys: []string{"rate:" + randKey}, args: []string{strconv.Itoa(ceilingCapacity), strconv.Itoa(ceilingRefill), "1", "1"}, decisions: 1}, nil
}

// scriptsPhase holds the phase's calls and every run's figures.
type scriptsPhase struct {
	calls     []scriptCall
	keys      int
	pipeline  int
	clients   int
	decisions int // per row and run
	callsPerS map[string][]float64
	cpu       map[string][]float64
}

// scriptCalls are the rows: the article's script, redis_rate's, ours, and ours with
// many buckets per call (16, as issue 23 measures it); the article's logic looped
// over 16 keys too while our batch is something else than that.
func (b *bench) scriptCalls(ctx context.Context) ([]scriptCall, error) {
	rr, err := redisRateCall(ctx, b.root)
	if err != nil {
		return nil, err
	}
	calls := []scriptCall{articleCall(), rr, ourCall(), ourBatch(16)}
	if ab := articleBatch(16); ab.source != calls[3].source {
		calls = append(calls, ab)
	}
	return calls, nil
}

// scriptsRun runs every row once on a fresh redis-server, rotated so that no row
// always goes first.
func (b *bench) scriptsRun(ctx context.Context, run int) error {
	if b.scripts == nil {
		calls, err := b.scriptCalls(ctx)
		if err != nil {
			return err
		}
		b.scripts = &scriptsPhase{calls: calls, keys: 100_000, pipeline: 16, clients: 50, decisions: 400_000,
			callsPerS: map[string][]float64{}, cpu: map[string][]float64{}}
		if b.opts.quick {
			b.scripts.decisions = 20_000
		}
	}
	sp := b.scripts
	rd, err := testenv.StartRedis(ctx, testenv.RedisOptions{Dir: filepath.Join(b.work, fmt.Sprintf("redis-scripts-%d", run))})
	if err != nil {
		return err
	}
	defer rd.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	defer rdb.Close()
	for _, c := range sp.calls {
		if err := checkScript(ctx, rdb, c); err != nil {
			return err
		}
	}
	for j := range sp.calls {
		c := sp.calls[(run+j)%len(sp.calls)]
		rate, cpu, err := redisBenchmark(ctx, rd, rdb, c, sp)
		if err != nil {
			return err
		}
		sp.callsPerS[c.name] = append(sp.callsPerS[c.name], rate)
		sp.cpu[c.name] = append(sp.cpu[c.name], cpu)
		b.logf("scripts run %d: %-13s %8.0f calls/s, %8.0f decisions/s, Redis CPU %.2f", run+1, c.name, rate, rate*float64(c.decisions), cpu)
	}
	return nil
}

// checkScript loads c's script and makes one call of it, with 0 for every random key:
// a script that errors or refuses would otherwise be measured as fast.
func checkScript(ctx context.Context, rdb *redis.Client, c scriptCall) error {
	sha, err := rdb.ScriptLoad(ctx, c.source).Result()
	if err != nil {
		return fmt.Errorf("scripts: SCRIPT LOAD %s: %w", c.name, err)
	}
	if sha != c.sha() {
		return fmt.Errorf("scripts: %s: SCRIPT LOAD returned %s, want %s", c.name, sha, c.sha())
	}
	if err := rdb.Process(ctx, redis.NewCmd(ctx, respArgs(c.command(rand.New(rand.NewPCG(1, 2)), 1))...)); err != nil {
		return fmt.Errorf("scripts: a call of %s fails: %w", c.name, err)
	}
	return nil
}

// respArgs decodes a RESP array of bulk strings (command's output) back into arguments.
func respArgs(b []byte) []any {
	lines := strings.SplitN(string(b), "\r\n", 2)
	n, _ := strconv.Atoi(strings.TrimPrefix(lines[0], "*"))
	rest := lines[1]
	out := make([]any, 0, n)
	for range n {
		hdr, body, _ := strings.Cut(rest, "\r\n")
		l, _ := strconv.Atoi(strings.TrimPrefix(hdr, "$"))
		out = append(out, body[:l])
		rest = body[l+2:]
	}
	return out
}

// redisBenchmark sends c until the row's decisions are made and returns its calls per
// second and Redis's busy fraction, after checking with INFO commandstats that every
// call ran and none failed.
func redisBenchmark(ctx context.Context, rd *testenv.Process, rdb *redis.Client, c scriptCall, sp *scriptsPhase) (float64, float64, error) {
	n := max(sp.decisions/c.decisions, 1000)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	cmds := make([][]byte, min(n, 10_000))
	for i := range cmds {
		cmds[i] = c.command(r, sp.keys)
	}
	before, err := evalshaStats(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	cpuBefore, err := redisCPU(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	elapsed, err := testenv.Blast(cctx, testenv.BlastOptions{Addr: rd.Addr(), Conns: sp.clients, Pipe: sp.pipeline, Total: n, Commands: cmds})
	if err != nil {
		return 0, 0, fmt.Errorf("scripts: %s: %w", c.name, err)
	}
	after, err := evalshaStats(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	cpuAfter, err := redisCPU(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	if calls := after.calls - before.calls; calls < int64(n) {
		return 0, 0, fmt.Errorf("scripts: %s made %d script calls, want %d", c.name, calls, n)
	}
	if failed := after.failed - before.failed; failed > 0 {
		return 0, 0, fmt.Errorf("scripts: %d of the calls of %s failed", failed, c.name)
	}
	return float64(n) / elapsed.Seconds(), (cpuAfter - cpuBefore) / elapsed.Seconds(), nil
}

type commandStats struct{ calls, failed int64 }

// evalshaStats reads INFO commandstats' evalsha line: calls, and the failed and
// rejected calls (Redis 7).
func evalshaStats(ctx context.Context, rdb *redis.Client) (commandStats, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return commandStats{}, fmt.Errorf("INFO commandstats: %w", err)
	}
	var s commandStats
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				s.calls = x
			case "failed_calls", "rejected_calls":
				s.failed += x
			}
		}
	}
	return s, nil
}

// redisCPU is the CPU seconds the server has used (INFO cpu, user + system).
func redisCPU(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	found := false
	for line := range strings.Lines(info) {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu %q: %w", line, err)
				}
				total += x
				found = true
			}
		}
	}
	if !found {
		return 0, errors.New("INFO cpu has no used_cpu_user")
	}
	return total, nil
}

// result is the phase's figures: every ratio is taken run by run.
func (sp *scriptsPhase) result() *results.Scripts {
	s := &results.Scripts{Keys: sp.keys, Pipeline: sp.pipeline, Clients: sp.clients, Decisions: sp.decisions}
	perRun := func(name string, per int) []float64 {
		xs := make([]float64, len(sp.callsPerS[name]))
		for i, v := range sp.callsPerS[name] {
			xs[i] = v * float64(per)
		}
		return xs
	}
	ratio := func(a, b []float64) []float64 {
		var xs []float64
		for i := range min(len(a), len(b)) {
			if b[i] > 0 {
				xs = append(xs, a[i]/b[i])
			}
		}
		return xs
	}
	article, redisRate := perRun("article", 1), perRun("redis_rate", 1)
	for _, c := range sp.calls {
		d := perRun(c.name, c.decisions)
		s.Rows = append(s.Rows, results.ScriptRow{
			Script: c.name, Origin: c.origin, DecisionsPerCall: c.decisions,
			CallsPerS: results.StatOf(sp.callsPerS[c.name]), DecisionsPerS: results.StatOf(d),
			RedisCPU: results.StatOf(sp.cpu[c.name]), VsArticle: results.StatOf(ratio(d, article)), VsRedisRate: results.StatOf(ratio(d, redisRate)),
		})
	}
	return s
}
