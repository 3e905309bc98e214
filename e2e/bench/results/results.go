package results

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// SchemaVersion is the version of both results files; a file of another version is
// refused rather than half read.
const SchemaVersion = 1

// Bench is docs/bench/results.json: one run of cmd/bench. A phase the run did not
// measure is nil (its section says so).
type Bench struct {
	Schema   int       `json:"schema"`
	Run      Run       `json:"run"`
	Overhead *Overhead `json:"overhead,omitempty"`
	Engine   *Engine   `json:"engine,omitempty"`
	Scripts  *Scripts  `json:"scripts,omitempty"`
	Memory   *Memory   `json:"memory,omitempty"`
	Accuracy *Accuracy `json:"accuracy,omitempty"`
	Profile  *Profile  `json:"profile,omitempty"`
	HotPath  []HotPath `json:"hot_path,omitempty"`
	// Commands are the go test command lines that run the other packages' benchmarks
	// as the suite ran them.
	Commands []string `json:"commands,omitempty"`
}

// Run says what produced the figures.
type Run struct {
	Command string    `json:"command"` // e.g. "go run ./cmd/bench -runs 3"
	Runs    int       `json:"runs"`    // runs of every repeated measurement
	Quick   bool      `json:"quick"`   // a -quick smoke run: not figures to quote
	Phases  []string  `json:"phases"`
	Commit  string    `json:"commit"` // git describe --always --dirty of the measured tree
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Machine Machine   `json:"machine"`
	// Source is empty for a file the program wrote from its own run; otherwise it says
	// where the figures come from (a conversion from an older document).
	Source string `json:"source,omitempty"`
}

// Machine is where the run happened.
type Machine struct {
	CPU       string `json:"cpu"`
	NProc     int    `json:"nproc"`
	Memory    string `json:"memory"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Redis     string `json:"redis"`
	Postgres  string `json:"postgres"`
	LoadStart string `json:"load_start"` // /proc/loadavg's 1, 5, 15 minute figures
	LoadEnd   string `json:"load_end"`
}

// Stat is one figure over the runs: the median, the range, and the values.
type Stat struct {
	Med  float64   `json:"med"`
	Min  float64   `json:"min"`
	Max  float64   `json:"max"`
	N    int       `json:"n"`
	Runs []float64 `json:"runs,omitempty"` // absent in converted files
}

// StatOf is the median and range of xs, leaving out NaN and infinities; no value is
// the zero Stat (N = 0, shown as "–").
func StatOf(xs []float64) Stat {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Stat{}
	}
	s := Stat{Runs: slices.Clone(v), N: len(v)}
	slices.Sort(v)
	s.Min, s.Max = v[0], v[len(v)-1]
	if len(v)%2 == 1 {
		s.Med = v[len(v)/2]
	} else {
		s.Med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return s
}

// Measured reports whether the stat holds a value.
func (s Stat) Measured() bool { return s.N > 0 }

// Duration is a time.Duration written as Go writes one ("1.5s").
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// Seconds is the duration in seconds.
func (d Duration) Seconds() float64 { return time.Duration(d).Seconds() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Overhead is section 1: a fast upstream reached directly, through gateways and through
// a bare reverse proxy, at fixed rates, and the highest rate each path sustains.
type Overhead struct {
	Duration     Duration `json:"duration"`      // one fixed-rate measurement
	StepDuration Duration `json:"step_duration"` // one step of the throughput search
	MaxP99       Duration `json:"max_p99"`       // the search's latency bound
	MinSent      float64  `json:"min_sent"`      // the share of the offered requests a passing step sends
	Paths        []Path   `json:"paths"`         // in the order of the tables
	Rates        []Rate   `json:"rates"`
	Max          []MaxRow `json:"max"`
}

// Path is one way of reaching the upstream: "a" direct, "b" gateway with the local
// limiter, "c" gateway + Redis (defaults), "e" the same with a 100 ms timeout, "d"
// gateway with Redis down, "r" a bare httputil.ReverseProxy.
type Path struct {
	Key   string `json:"key"`
	Label string `json:"label"`
}

// Rate is every path at one offered rate.
type Rate struct {
	RPS  float64      `json:"rps"`
	Rows []LatencyRow `json:"rows"`
}

// LatencyRow is one path at one rate: client-side latency (ms) and, for every path but
// the direct one, what it adds to the direct path, run by run.
type LatencyRow struct {
	Path        string `json:"path"`
	P50Ms       Stat   `json:"p50_ms"`
	P99Ms       Stat   `json:"p99_ms"`
	P999Ms      Stat   `json:"p999_ms"`
	AddedP50Ms  Stat   `json:"added_p50_ms,omitzero"`
	AddedP99Ms  Stat   `json:"added_p99_ms,omitzero"`
	AddedP999Ms Stat   `json:"added_p999_ms,omitzero"`
	FallbackPct Stat   `json:"fallback_pct,omitzero"` // decisions taken by the fallback
	Failed      Stat   `json:"failed"`                // requests not answered 200
}

// MaxRow is one path's throughput search.
type MaxRow struct {
	Path string `json:"path"`
	RPS  Stat   `json:"rps"`
	// BelowRPS: when no rate passed in some run, the lowest rate tried (shown "< N").
	BelowRPS float64   `json:"below_rps,omitempty"`
	VsLocal  Stat      `json:"vs_local,omitzero"` // RPS / path b's, run by run
	Capped   bool      `json:"capped"`            // some run had no failing step: the maximum is higher
	Failures []Failure `json:"failures,omitempty"`
}

// Failure is the first failing rate of one run and why it failed.
type Failure struct {
	RPS float64 `json:"rps"`
	Why string  `json:"why"`
}

// Engine is section 2: gateway/limiter's BenchmarkDecisionEngine.
type Engine struct {
	Groups   []EngineGroup    `json:"groups"`   // "hot", then "100k"
	Relative []EngineRelative `json:"relative"` // ours (pipelined) over the others
	Leases   []LeaseRow       `json:"leases"`
}

// EngineGroup is every row on one key set.
type EngineGroup struct {
	Keys string      `json:"keys"` // "hot" (one key) or "100k"
	Rows []EngineRow `json:"rows"`
}

// EngineRow is one mode at one caller count. Ceiling rows (redis-benchmark) have only
// decisions/s and Redis CPU.
type EngineRow struct {
	Callers             int    `json:"callers"`
	Mode                string `json:"mode"` // ceiling-P1, ceiling-P16, bare-evalsha, plain, pipelined, redis_rate, leases
	DecisionsPerS       Stat   `json:"decisions_per_s"`
	P50Us               Stat   `json:"p50_us,omitzero"`
	P99Us               Stat   `json:"p99_us,omitzero"`
	RedisCPU            Stat   `json:"redis_cpu"` // the server's busy fraction
	CallsPerAdmitted    Stat   `json:"calls_per_admitted,omitzero"`
	AdmittedPerDecision Stat   `json:"admitted_per_decision,omitzero"`
	AllocsPerOp         Stat   `json:"allocs_per_op,omitzero"`
}

// EngineRelative is ours (pipelined) over other rows of the same group, decisions/s,
// ratio taken run by run.
type EngineRelative struct {
	Keys        string `json:"keys"`
	Callers     int    `json:"callers"`
	VsCeiling   Stat   `json:"vs_ceiling_p16"`
	VsRedisRate Stat   `json:"vs_redis_rate"`
	VsBare      Stat   `json:"vs_bare_evalsha"`
	VsPlain     Stat   `json:"vs_plain"`
}

// LeaseRow is the leases check at one caller count (a hot key at the article's
// hot-tenant rule): Redis calls per admitted decision, and whether every run made at
// most one call per 20 admitted, the last, partly spent lease aside (nil: not recorded).
type LeaseRow struct {
	Callers          int   `json:"callers"`
	CallsPerAdmitted Stat  `json:"calls_per_admitted"`
	WithinBound      *bool `json:"within_bound,omitempty"`
}

// Scripts is section 3: the Redis ceiling of each script, redis-benchmark EVALSHA on
// one redis-server, run by run side by side.
type Scripts struct {
	Keys     int `json:"keys"`     // random keys (redis-benchmark -r)
	Pipeline int `json:"pipeline"` // -P
	Clients  int `json:"clients"`  // -c
	// Decisions per row and run: each row makes Decisions / DecisionsPerCall calls.
	Decisions int         `json:"decisions"`
	Rows      []ScriptRow `json:"rows"`
}

// ScriptRow is one script's ceiling.
type ScriptRow struct {
	Script           string `json:"script"` // article, redis_rate, ours, article-batch, ours-batch
	Origin           string `json:"origin"` // where its text comes from
	DecisionsPerCall int    `json:"decisions_per_call"`
	CallsPerS        Stat   `json:"calls_per_s"`
	DecisionsPerS    Stat   `json:"decisions_per_s"`
	RedisCPU         Stat   `json:"redis_cpu"`
	VsArticle        Stat   `json:"vs_article"`    // decisions/s over the article's, run by run
	VsRedisRate      Stat   `json:"vs_redis_rate"` // over redis_rate's
}

// Memory is section 4.
type Memory struct {
	Redis   *RedisMemory   `json:"redis,omitempty"`
	Local   *LocalMemory   `json:"local,omitempty"`
	Gateway *GatewayMemory `json:"gateway,omitempty"`
}

// RedisMemory is what buckets cost Redis, written as the gateway writes them.
type RedisMemory struct {
	KeysPerBucket int            `json:"keys_per_bucket"` // Redis keys one bucket holds
	UsageTypical  Stat           `json:"usage_typical"`   // MEMORY USAGE, 31-byte key
	UsageLongest  Stat           `json:"usage_longest"`   // MEMORY USAGE, 134-byte key
	PerBucket     []BucketMemory `json:"per_bucket"`
}

// BucketMemory is the used_memory delta per bucket with Buckets buckets.
type BucketMemory struct {
	Buckets int64 `json:"buckets"`
	Bytes   Stat  `json:"bytes"`
}

// LocalMemory is gateway/limiter.Local's buckets, from its tests.
type LocalMemory struct {
	Buckets        int64   `json:"buckets"`
	MB             float64 `json:"mb"`
	BytesPerBucket float64 `json:"bytes_per_bucket"`
	Keys           int64   `json:"keys"` // distinct keys of the idle-eviction test
	Live           int64   `json:"live"`
	Peak           int64   `json:"peak"`
}

// GatewayMemory is a gateway in database mode holding many tenants and keys.
type GatewayMemory struct {
	Tenants       int      `json:"tenants"`
	Keys          int      `json:"keys"`
	Rules         int      `json:"rules"`
	Seed          Duration `json:"seed"` // the COPY of rules and keys
	BaseRSS       float64  `json:"base_rss_bytes"`
	RSS           float64  `json:"rss_bytes"`
	PeakRSS       float64  `json:"peak_rss_bytes"`
	ReloadRSS     float64  `json:"reload_rss_bytes"`
	ReloadPeakRSS float64  `json:"reload_peak_rss_bytes"`
	BaseHeap      float64  `json:"base_heap_bytes"`
	Heap          float64  `json:"heap_bytes"`
	Ready         Duration `json:"ready"`  // process start to the first snapshot served
	Reload        Duration `json:"reload"` // a rule change to the reloaded snapshot served
	LoadSeconds   Stat     `json:"load_seconds"`
}

// Accuracy is section 5: many limiter instances on one Redis against the exact bound.
type Accuracy struct {
	Instances int           `json:"instances"`
	Tenants   int           `json:"tenants"`
	Offered   float64       `json:"offered"` // offered rate / refill
	Duration  Duration      `json:"duration"`
	Rows      []AccuracyRow `json:"rows"`
}

// AccuracyRow is one limiter: quotaplane (5 ms timeout), quotaplane-100ms, redis_rate.
// Errors are in % of the reference.
type AccuracyRow struct {
	Limiter      string `json:"limiter"`
	MaxErr       Stat   `json:"max_err_pct"`
	MeanErr      Stat   `json:"mean_err_pct"`
	MaxOver      Stat   `json:"max_over_pct"`
	MaxErrExact  Stat   `json:"max_err_exact_pct"`
	MeanErrExact Stat   `json:"mean_err_exact_pct"`
	Decisions    Stat   `json:"decisions"`
	FallbackPct  Stat   `json:"fallback_pct"`
}

// Profile is section 6: CPU and allocation profiles of a loaded gateway.
type Profile struct {
	RPS              float64     `json:"rps"`
	Duration         Duration    `json:"duration"`
	Requests         float64     `json:"requests"`
	FallbackPct      float64     `json:"fallback_pct"`
	CPUPerRequestUs  float64     `json:"cpu_per_request_us"`
	BytesPerRequest  float64     `json:"bytes_per_request"`
	AllocsPerRequest float64     `json:"allocs_per_request"`
	Classes          []CostClass `json:"classes"` // by CPU share, largest first
}

// CostClass is one named cost of the hot path (e2e/bench's classes) and its shares.
type CostClass struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	CPUPct     float64 `json:"cpu_pct"`
	BytesPct   float64 `json:"bytes_pct"`
	ObjectsPct float64 `json:"objects_pct"`
}

// HotPath is one benchmark of lua, gateway/limiter or gateway.
type HotPath struct {
	Benchmark   string `json:"benchmark"`
	AllocsPerOp Stat   `json:"allocs_per_op"`
	BytesPerOp  Stat   `json:"bytes_per_op"`
	NsPerOp     Stat   `json:"ns_per_op"`
}

// RLS is docs/bench/rls.json: one run of cmd/rlsbench.
type RLS struct {
	Schema  int       `json:"schema"`
	Command string    `json:"command"`
	Commit  string    `json:"commit"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Source  string    `json:"source,omitempty"` // as Run.Source
	CPUs    int       `json:"cpus"`
	// LoadStart is the load average when measuring began (after the builds and the
	// wait for a quiet machine); the verdict needs its 1-minute figure below MaxLoad.
	LoadStart string   `json:"load_start"`
	LoadEnd   string   `json:"load_end"` // includes the benchmark's own load
	Keys      int      `json:"keys"`
	Conns     int      `json:"conns"`
	Duration  Duration `json:"duration"`
	Warmup    Duration `json:"warmup"`
	// Ratelimit is the envoyproxy/ratelimit module built; RatelimitError why it could
	// not be (then its rows are missing).
	Ratelimit      string     `json:"ratelimit"`
	RatelimitError string     `json:"ratelimit_error,omitempty"`
	Rows           []RLSRow   `json:"rows"`
	Check          *CheckLoad `json:"check,omitempty"`
}

// RLSRow is one server at one caller count.
type RLSRow struct {
	Server        string             `json:"server"` // quotaplane or ratelimit
	Callers       int                `json:"callers"`
	Calls         int64              `json:"calls"`
	Errors        int64              `json:"errors"`
	OverLimit     int64              `json:"over_limit"`
	DecisionsPerS float64            `json:"decisions_per_s"`
	P50Ms         float64            `json:"p50_ms"`
	P99Ms         float64            `json:"p99_ms"`
	Sources       map[string]float64 `json:"sources,omitempty"` // the gateway's decisions so far by source
}

// CheckLoad is nginx alone and nginx + auth_request to /v1/check at a fixed rate.
type CheckLoad struct {
	RPS      int        `json:"rps"`
	Duration Duration   `json:"duration"`
	Rows     []CheckRow `json:"rows"` // "nginx", then "nginx+check"
}

// CheckRow is one open-loop run.
type CheckRow struct {
	Path     string           `json:"path"`
	Requests int64            `json:"requests"`
	Errors   int64            `json:"errors"`
	P50Ms    float64          `json:"p50_ms"`
	P99Ms    float64          `json:"p99_ms"`
	MaxMs    float64          `json:"max_ms"`
	Statuses map[string]int64 `json:"statuses"`
}

// ReadFile reads a results file into v (*Bench or *RLS), refusing unknown fields and
// other schema versions.
func ReadFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read results: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("read results %s: %w", path, err)
	}
	var schema int
	switch r := v.(type) {
	case *Bench:
		schema = r.Schema
	case *RLS:
		schema = r.Schema
	default:
		return fmt.Errorf("read results %s: %T is not a results type", path, v)
	}
	if schema != SchemaVersion {
		return fmt.Errorf("read results %s: schema %d, this program reads %d", path, schema, SchemaVersion)
	}
	return nil
}

// WriteFile writes v (*Bench or *RLS) as indented JSON.
func WriteFile(path string, v any) error {
	switch r := v.(type) {
	case *Bench:
		r.Schema = SchemaVersion
	case *RLS:
		r.Schema = SchemaVersion
	default:
		return errors.New("write results: not a results type")
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write results %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}
