package lua

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// newRedis starts a fresh redis-server for one test and returns a client for it.
func newRedis(t testing.TB) *redis.Client {
	t.Helper()
	p := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// stored is a bucket's value as state.lua writes it.
type stored struct {
	fullS        uint32
	fullUs, c, r float64
}

func (s stored) bytes() []byte {
	b := make([]byte, 28)
	binary.LittleEndian.PutUint32(b, s.fullS)
	binary.LittleEndian.PutUint64(b[4:], math.Float64bits(s.fullUs))
	binary.LittleEndian.PutUint64(b[12:], math.Float64bits(s.c))
	binary.LittleEndian.PutUint64(b[20:], math.Float64bits(s.r))
	return b
}

func readStored(t testing.TB, rdb *redis.Client, key string) stored {
	t.Helper()
	b, err := rdb.Get(context.Background(), key).Bytes()
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	if len(b) != 28 {
		t.Fatalf("GET %s: %d bytes, want 28", key, len(b))
	}
	return stored{
		fullS:  binary.LittleEndian.Uint32(b),
		fullUs: math.Float64frombits(binary.LittleEndian.Uint64(b[4:])),
		c:      math.Float64frombits(binary.LittleEndian.Uint64(b[12:])),
		r:      math.Float64frombits(binary.LittleEndian.Uint64(b[20:])),
	}
}

// redisMicros is the server's TIME in microseconds.
func redisMicros(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}

// setTokens writes a bucket of capacity c, refill r holding tokens at Redis's now plus
// ahead (a positive ahead freezes it: it is as if TIME were behind), without expiry.
func setTokens(t testing.TB, rdb *redis.Client, key string, tokens float64, c int64, r float64, ahead time.Duration) {
	t.Helper()
	now := redisMicros(t, rdb) + ahead.Microseconds()
	full := float64(now) + (float64(c)-tokens)*1e6/r
	s := stored{fullS: uint32(now / 1e6), c: float64(c), r: r}
	s.fullUs = full - float64(s.fullS)*1e6
	if err := rdb.Set(context.Background(), key, s.bytes(), 0).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
}

// age moves a bucket's full time back by d: the same as d passing without a call.
func age(t testing.TB, rdb *redis.Client, key string, d time.Duration) {
	t.Helper()
	s := readStored(t, rdb, key)
	s.fullUs -= float64(d.Microseconds())
	if err := rdb.Set(context.Background(), key, s.bytes(), redis.KeepTTL).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
}

// tokensNow is what the bucket holds now, by Redis TIME, under its stored rule.
func tokensNow(t testing.TB, rdb *redis.Client, key string) float64 {
	t.Helper()
	s := readStored(t, rdb, key)
	d := (float64(s.fullS)*1e6 + s.fullUs) - float64(redisMicros(t, rdb))
	if d <= 0 {
		return s.c
	}
	return s.c - d*s.r/1e6
}

func one(key string, c int64, r float64) []Bucket {
	return []Bucket{{Key: key, Capacity: c, Refill: r, Cap: NoCap}}
}

func mustDecide(t testing.TB, b *TokenBucket, ds ...Decision) []Outcome {
	t.Helper()
	out, err := b.Decide(context.Background(), ds...)
	if err != nil {
		t.Fatalf("Decide(%+v): %v", ds, err)
	}
	return out
}

func mustTake(t testing.TB, b *TokenBucket, key string, c int64, r float64, cost int64) Outcome {
	t.Helper()
	return mustDecide(t, b, Decision{Op: OpTake, N: cost, Buckets: one(key, c, r)})[0]
}

// commandCalls is how many times Redis ran each command so far (INFO commandstats,
// which counts the calls a script makes).
func commandCalls(t testing.TB, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		if n, err := strconv.ParseInt(calls, 10, 64); err == nil {
			out[strings.TrimPrefix(name, "cmdstat_")] = n
		}
	}
	return out
}
