package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
)

// normBucket blanks what depends on when the test ran: times, TTLs and times to full.
func normBucket(s string) string {
	s = normTimes(s)
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^(TTL\s+|FULL IN\s+)\S+$`),
		regexp.MustCompile(`\(\S+ from now\)`),
		regexp.MustCompile(`("ttl_ms": |"full_in_ms": |"raised_ago_ms": )\d+`),
		regexp.MustCompile(`(by a raise )\S+`),
	} {
		s = re.ReplaceAllString(s, "${1}X")
	}
	return s
}

func TestBucketInspect(t *testing.T) {
	t.Parallel()
	c, _ := newDB(t)
	rp := testenv.Redis(t)
	c.env[envRedisURL] = testenv.RedisURL(rp)
	c.ok("regions", "add", "us-east")
	c.ok("regions", "add", "eu-west")
	// Regional limit in us-east: capacity 100 x 0.75 = 75, refill 0.00004 x 0.75 = 0.00003/s:
	// slow enough that the figures do not move while the test runs.
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "create-order", "--capacity", "100", "--refill", "0.00004")
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "hot", "--capacity", "90", "--refill", "0.00004", "--shards", "3")
	// A rule with a band (issue 24): its own bucket and the band's, 60 x 0.75 = 45 a region.
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "planned", "--capacity", "100", "--refill", "0.00004", "--band", "hour=60@0.00002")
	c.ok("shares", "set", "--tenant", "shop-a", "us-east=0.75", "eu-west=0.25", "--reason", "test", "--apply")

	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
	defer rdb.Close()
	tb := lua.NewTokenBucket(rdb)
	keys := lua.Keys{}
	// The gateway takes 20 tokens of the regional bucket, and 5 of shard 1 of the hot rule.
	if _, err := tb.Take(ctx, keys.Bucket("shop-a", "create-order"), 75, 0.00003, 20); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Take(ctx, keys.Shard("shop-a", "hot", 1), 23, 0.00001, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Take(ctx, keys.Band("shop-a", "planned", "hour"), 45, 0.000015, 30); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"bucket_bands", []string{"bucket", "inspect", "--tenant", "shop-a", "--route", "planned", "--region", "us-east"}},
		{"bucket_region", []string{"bucket", "inspect", "--tenant", "shop-a", "--route", "create-order", "--region", "us-east"}},
		{"bucket_shards", []string{"bucket", "inspect", "--tenant", "shop-a", "--route", "hot", "--region", "us-east"}},
		{"bucket_missing", []string{"bucket", "inspect", "--tenant", "shop-b", "--route", "create-order", "--capacity", "10", "--refill", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, format := range []string{"table", "json"} {
				r := c.ok(append(tc.args, "-o", format)...)
				golden(t, tc.name+"."+format, normBucket(r.stdout))
			}
		})
	}

	// A calendar quota band is a counter, not a bucket: left out, with a warning.
	c.ok("rules", "set", "--apply", "--tenant", "shop-a", "--route", "quota", "--capacity", "100", "--refill", "0.00004",
		"--band", "hour=60@0.00002", "--band", "month=1000/month")
	{
		r := c.ok("bucket", "inspect", "--tenant", "shop-a", "--route", "quota", "--region", "us-east", "-o", "json")
		var rep bucketReport
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Buckets) != 2 || rep.Buckets[0].Band != regions.PrimaryBand || rep.Buckets[1].Band != "hour" ||
			!strings.Contains(r.stderr, "calendar quota bands (month) are counters per period, not buckets") {
			t.Errorf("bucket inspect of a rule with a quota: %+v, stderr %q", rep.Buckets, r.stderr)
		}
	}

	// Tokens now on Redis's clock, by the scripts' maths: a bucket of 10 refilling 2/s,
	// 7 tokens taken, is full 3.5 s later and holds 3 now (plus the test's own delay).
	key := keys.Bucket("shop-c", "r")
	if _, err := tb.Take(ctx, key, 10, 2, 7); err != nil {
		t.Fatal(err)
	}
	r := c.ok("bucket", "inspect", "--tenant", "shop-c", "--route", "r", "--capacity", "10", "--refill", "2", "-o", "json")
	var rep bucketReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	b := rep.Buckets[0]
	if !b.Exists || *b.StoredCapacity != 10 || *b.StoredRefill != 2 || *b.TokensNow < 3 || *b.TokensNow > 3.5 ||
		*b.TTLMillis > 4600 || *b.TTLMillis < 4000 || b.FullAt.Sub(rep.RedisTime) > 3500*time.Millisecond {
		t.Errorf("bucket = %+v (tokens now %v, ttl %v)", b, *b.TokensNow, *b.TTLMillis)
	}
	// Under another rule than the stored one, by flags: converted at this call, with a
	// warning that a gateway converts it at the rule's change.
	r = c.ok("bucket", "inspect", "--tenant", "shop-c", "--route", "r", "--capacity", "10", "--refill", "1")
	if !strings.Contains(r.stderr, "stored under another rule: tokens now converts it at this call") {
		t.Errorf("another rule by flags: stderr %q", r.stderr)
	}
	if r = c.ok("bucket", "inspect", "--tenant", "shop-c", "--route", "r", "--capacity", "10", "--refill", "2"); strings.Contains(r.stderr, "another rule") {
		t.Errorf("the stored rule by flags: stderr %q", r.stderr)
	}
	checkError(t, c.run("bucket", "inspect", "--tenant", "shop-c", "--route", "r", "--region", "us-east", "--reload-lag", "-1s"), exitUsage, "--reload-lag -1s: must not be negative", "")
	// Without a size, the stored state only, and a warning.
	r = c.ok("bucket", "inspect", "--tenant", "shop-c", "--route", "r")
	if !strings.Contains(r.stderr, "warning: tokens now needs the bucket's size") || strings.Contains(r.stdout, "TOKENS NOW") {
		t.Errorf("no size: stdout %q stderr %q", r.stdout, r.stderr)
	}
	// Not a bucket.
	rdb.Set(ctx, keys.Bucket("shop-d", "r"), "x", 0)
	checkError(t, c.run("bucket", "inspect", "--tenant", "shop-d", "--route", "r"), exitFailure, "not a bucket", "")

	redisURL := testenv.RedisURL(rp)
	rp.Kill()
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"redis down", []string{"bucket", "inspect", "--tenant", "shop-a", "--route", "r", "--redis-url", strings.Replace(redisURL, "redis://", "redis://:Sekr1t-pass@", 1)},
			exitUnreachable, "redis at " + rp.Addr() + " unreachable"},
		{"no redis", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--redis-url", ""}, exitUsage, "no Redis: set --redis-url or RATELIMIT_REDIS_URL"},
		{"bad tenant", []string{"bucket", "inspect", "--tenant", "a:b", "--route", "r"}, exitUsage, `invalid tenant id "a:b"`},
		{"missing route", []string{"bucket", "inspect", "--tenant", "a"}, exitUsage, `required flag(s) "route" not set`},
		{"both sizes", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--region", "us-east", "--capacity", "1", "--refill", "1"}, exitUsage, "either --region or --capacity and --refill"},
		{"capacity alone", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--capacity", "1"}, exitUsage, "--capacity and --refill go together"},
		{"zero refill", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--capacity", "1", "--refill", "0"}, exitUsage, "--refill 0: must be a number > 0"},
		{"unknown region", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--region", "mars"}, exitUsage, `unknown region "mars"`},
		{"bad url", []string{"bucket", "inspect", "--tenant", "a", "--route", "r", "--redis-url", "http://x:Sekr1t-pass@h"}, exitUsage, "--redis-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no redis" {
				delete(c.env, envRedisURL)
				defer func() { c.env[envRedisURL] = redisURL }()
			}
			checkError(t, c.run(tc.args...), tc.code, tc.contains, "Sekr1t-pass")
		})
	}
}
