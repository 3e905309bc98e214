package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/lua"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// bucketReport is the JSON of `bucket inspect`.
type bucketReport struct {
	Tenant string `json:"tenant"`
	Route  string `json:"route"`
	// RedisTime is the Redis server's clock when the buckets were read (the buckets'
	// clock).
	RedisTime time.Time `json:"redis_time"`
	// Limit is the regional bucket's size, null when neither --region nor --capacity and
	// --refill were given.
	Limit   *bucketLimit  `json:"limit"`
	Buckets []bucketState `json:"buckets"`
}

// bucketLimit is the size of the bucket being inspected, and where it came from.
type bucketLimit struct {
	regions.Limit
	// Source says where it came from: "flags", or "database" (the rule scaled by the
	// region's effective share).
	Source string  `json:"source"`
	Region string  `json:"region,omitempty"`
	Share  float64 `json:"share,omitempty"`
	Shards int     `json:"shards"`
}

// bucketState is one Redis key: the bucket, or one shard of it.
type bucketState struct {
	Key string `json:"key"`
	// Band names the rule's band the bucket holds, for a rule with bands (issue 24):
	// "rate" for the rule's own, then each band's name; absent otherwise.
	Band string `json:"band,omitempty"`
	// BandLimit is that band's regional limit (the rule's own is Limit).
	BandLimit *regions.Limit `json:"band_limit,omitempty"`
	Exists    bool           `json:"exists"`
	// FullAt is when the stored bucket is full again, and StoredCapacity and
	// StoredRefill the rule it was written under; null when the key does not exist (a
	// missing bucket is a full one).
	FullAt         *time.Time `json:"full_at"`
	StoredCapacity *float64   `json:"stored_capacity"`
	StoredRefill   *float64   `json:"stored_refill"`
	// TTLMillis is the key's remaining time to live; null when it does not exist.
	TTLMillis *int64 `json:"ttl_ms"`
	// TokensNow is the count after refilling up to RedisTime (null without a limit);
	// FullInMillis is how long until the bucket is full if nothing is taken.
	TokensNow    *float64 `json:"tokens_now"`
	FullInMillis *int64   `json:"full_in_ms"`
	// HeldTo, with --region, is the most the gateways let the bucket hold now after a
	// raise of its limit (the old limit plus the refill since the raise; docs/reliability.md,
	// "A raise is marked"), and RaisedAgoMillis how long ago that raise was; absent when
	// no raise holds it.
	HeldTo          *float64 `json:"held_to,omitempty"`
	RaisedAgoMillis *int64   `json:"raised_ago_ms,omitempty"`
}

type bucketOptions struct {
	redisURL, tenant, route, region, prefix string
	capacity                                int64
	refill                                  float64
	shards                                  int
	reloadLag                               time.Duration
}

func newBucketCmd(a *app) *cobra.Command {
	var o bucketOptions
	inspect := &cobra.Command{
		Use:   "inspect --redis-url URL --tenant T --route R [--region R | --capacity N --refill X]",
		Short: "Show a tenant's bucket in a region's Redis: tokens now, last refill, TTL",
		Long: `Show a tenant's bucket for one route in one region's Redis: the stored tokens and the
time of the last refill (Redis TIME), the key's TTL, and, given the bucket's size, the
tokens available now and how long until it is full.

The size is the regional limit: with --region, the tenant's rule scaled by the region's
effective share, read from the database (sharded rules: every shard is shown); or give
--capacity and --refill (and --shards) yourself. Nothing is written.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error { return a.bucketInspect(cmd, o) }),
	}
	f := inspect.Flags()
	f.StringVar(&o.redisURL, "redis-url", "", "the region's Redis, redis://HOST:PORT/DB (env "+envRedisURL+")")
	f.StringVar(&o.tenant, "tenant", "", "tenant id (required)")
	f.StringVar(&o.route, "route", "", "route id (required)")
	f.StringVar(&o.region, "region", "", "read the bucket's size from the database: the rule scaled by this region's share")
	f.Int64Var(&o.capacity, "capacity", 0, "the regional bucket's capacity (instead of --region)")
	f.Float64Var(&o.refill, "refill", 0, "the regional bucket's refill per second (instead of --region)")
	f.IntVar(&o.shards, "shards", 1, "with --capacity: the rule's shards")
	f.DurationVar(&o.reloadLag, "reload-lag", 31*time.Second, "with --region: the gateways' reload_interval + 1s; a bucket stored under an older rule converts this long after the rule's change, as theirs do")
	f.StringVar(&o.prefix, "key-prefix", lua.DefaultPrefix, "the gateways' bucket key prefix")
	_ = inspect.MarkFlagRequired("tenant")
	_ = inspect.MarkFlagRequired("route")
	return groupCmd("bucket", "Inspect rate-limit buckets in Redis", inspect)
}

func (a *app) bucketInspect(cmd *cobra.Command, o bucketOptions) error {
	if o.redisURL == "" {
		o.redisURL = a.getenv(envRedisURL)
		if old := a.getenv(envRedisURLOld); o.redisURL == "" && old != "" {
			o.redisURL = old
			a.warnf("%s is deprecated: set %s (the name the gateway reads)", envRedisURLOld, envRedisURL)
		}
	}
	a.redisURL = o.redisURL
	if o.redisURL == "" {
		return usagef("no Redis: set --redis-url or %s", envRedisURL)
	}
	if err := checkID("tenant", o.tenant); err != nil {
		return err
	}
	if err := checkID("route", o.route); err != nil {
		return err
	}
	f := cmd.Flags()
	byFlags := f.Changed("capacity") || f.Changed("refill")
	switch {
	case o.region != "" && byFlags:
		return usagef("give either --region or --capacity and --refill, not both")
	case byFlags && !(f.Changed("capacity") && f.Changed("refill")):
		return usagef("--capacity and --refill go together")
	}
	if byFlags {
		if err := checkPositiveInt("capacity", o.capacity); err != nil {
			return err
		}
		if err := checkPositiveFloat("refill", o.refill); err != nil {
			return err
		}
	}
	if o.reloadLag < 0 {
		return usagef("--reload-lag %v: must not be negative", o.reloadLag)
	}
	if o.shards < 1 || o.shards > regions.MaxShards {
		return usagef("--shards %d: must be between 1 and %d", o.shards, regions.MaxShards)
	}
	if o.region != "" {
		if err := checkID("region", o.region); err != nil {
			return err
		}
	}
	opts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return usagef("--redis-url: %v", oneLine(err, secretsOf(o.redisURL)))
	}

	var limit *bucketLimit
	var bands []regions.BandLimit // the rule's further token-bucket bands, scaled (with --region)
	var quotas []string           // the names of its calendar quota bands, not shown
	// holds is, with --region, the raise hold of bucket i (band "" the rule's own, or a
	// shard of it) of limit l: the most it may hold now, since when, and whether it holds.
	var holds func(i int, band string, l regions.Limit) (float64, time.Duration, bool)
	var changed time.Duration // with --region, since the limit last changed (a stored bucket of another rule converts then)
	switch {
	case byFlags:
		limit = &bucketLimit{Limit: regions.Limit{Capacity: o.capacity, RefillPerSecond: o.refill}, Source: "flags", Shards: o.shards}
	case o.region != "":
		err := a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
			v, err := a.loadView(ctx, st, o.tenant)
			if err != nil {
				return err
			}
			known := false
			for _, r := range v.regions {
				known = known || r == o.region
			}
			if !known {
				return usagef("unknown region %q (see ratectl regions list)", o.region)
			}
			// The raises that may hold the buckets, as the gateways read them.
			if v.raises, err = st.Raises(ctx, v.rules, v.planRules); err != nil {
				return err
			}
			if err := v.build(); err != nil {
				return err
			}
			rule, lim, share := v.snap.RegionalRule(o.region, o.tenant, o.route)
			raised, _, _ := v.snap.Raise(o.region, o.tenant, o.route, 0)
			changed = max(v.snap.ChangedAgo(o.region, o.tenant, o.route, rule, raised, 0)-o.reloadLag, 0)
			holds = func(i int, band string, l regions.Limit) (float64, time.Duration, bool) {
				var ago time.Duration
				var ratio float64
				var ok bool
				if band == "" {
					ago, ratio, ok = v.snap.Raise(o.region, o.tenant, o.route, 0)
				} else {
					ago, ratio, ok = v.snap.BandRaise(o.region, o.tenant, o.route, band, l.FillTime(), 0)
				}
				if !ok || (band == "" && i > 0) {
					return 0, 0, false // a shard other than 0: held as a new one (ratio 0) by the gateway; not shown
				}
				held := float64(l.Capacity)*min(max(ratio, 0), 1) + l.RefillPerSecond*ago.Seconds()
				return held, ago, held < float64(l.Capacity)
			}
			limit = &bucketLimit{Limit: regions.Limit{Capacity: lim.Capacity, RefillPerSecond: sig(lim.RefillPerSecond)}, Source: "database",
				Region: o.region, Share: share, Shards: max(1, rule.Shards)}
			// A calendar quota is a counter per period, not a bucket (no capacity refilled,
			// no raise hold): the buckets shown are the rule's and its token-bucket bands.
			for _, b := range rule.ScaledBands(share, time.Now(), nil) {
				if b.Quota == nil {
					bands = append(bands, b)
				} else {
					quotas = append(quotas, b.Name)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}

	keys := lua.Keys{Prefix: o.prefix}
	names := []string{keys.Bucket(o.tenant, o.route)}
	limits := []*bucketLimit{limit}
	shardLimit := limit
	switch {
	case limit != nil && limit.Shards > 1:
		// The gateway's own split (gateway/limiter): never more shards than tokens, the
		// capacity remainder one token each to the first shards.
		lim := limit.Limit
		k := lim.ShardCount(limit.Shards)
		limit.Shards = k
		names, limits = names[:0], limits[:0]
		for i := range k {
			names = append(names, keys.Shard(o.tenant, o.route, i))
			limits = append(limits, &bucketLimit{Limit: lim.Shard(k, i)})
		}
		shardLimit = limits[len(limits)-1] // the smallest shard
	case limit == nil && o.shards > 1:
		names, limits = names[:0], limits[:0]
		for i := range o.shards {
			names = append(names, keys.Shard(o.tenant, o.route, i))
			limits = append(limits, nil)
		}
	}

	// A rule with bands is never sharded: its bands' buckets follow its own (the
	// gateway's lua.Keys.Band), each with its band's regional limit.
	for _, b := range bands {
		names = append(names, keys.Band(o.tenant, o.route, b.Name))
		limits = append(limits, &bucketLimit{Limit: regions.Limit{Capacity: b.Limit.Capacity, RefillPerSecond: sig(b.Limit.RefillPerSecond)}})
	}

	ctx, cancel := a.withTimeout(cmd.Context())
	defer cancel()
	opts.MaxRetries = -1   // a read-only look: fail fast, say so
	opts.DialerRetries = 1 // (<= 0 would mean the default, 5)
	redis.SetLogger(quietRedisLogger{})
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	rep, err := readBuckets(ctx, rdb, names, limits, changed)
	if err != nil {
		if isConnectError(err) || errors.Is(err, context.DeadlineExceeded) {
			return unreachableError{"redis", opts.Addr, rootCause(err)}
		}
		return fmt.Errorf("read bucket %s/%s: %w", o.tenant, o.route, err)
	}
	rep.Tenant, rep.Route, rep.Limit = o.tenant, o.route, limit
	if holds != nil {
		for i := range rep.Buckets {
			band := ""
			if i >= len(rep.Buckets)-len(bands) {
				band = bands[i-(len(rep.Buckets)-len(bands))].Name
			}
			if l := limits[i]; l != nil {
				if held, ago, ok := holds(i, band, l.Limit); ok {
					h, ms := roundTo(held, 3), ago.Milliseconds()
					rep.Buckets[i].HeldTo, rep.Buckets[i].RaisedAgoMillis = &h, &ms
				}
			}
		}
	}
	if len(bands) > 0 {
		rep.Buckets[0].Band = regions.PrimaryBand
		for i, b := range bands {
			l := limits[1+i].Limit
			rep.Buckets[1+i].Band, rep.Buckets[1+i].BandLimit = b.Name, &l
		}
	}
	if err := a.render(cmd, rep, func(w io.Writer) { bucketTable(w, rep, shardLimit) }); err != nil {
		return err
	}
	if limit == nil {
		a.warnf("tokens now needs the bucket's size: give --region (reads the rule and share from the database) or --capacity and --refill")
	}
	if byFlags {
		for i, b := range rep.Buckets {
			if l := limits[i]; l != nil && b.StoredCapacity != nil && (*b.StoredCapacity != float64(l.Capacity) || *b.StoredRefill != l.RefillPerSecond) {
				a.warnf("%s was stored under another rule: tokens now converts it at this call; a gateway converts it at the rule's change (give --region to read it so)", b.Key)
				break
			}
		}
	}
	if len(quotas) > 0 {
		a.warnf("the rule's calendar quota bands (%s) are counters per period, not buckets: not shown", strings.Join(quotas, ", "))
	}
	return nil
}

// quietRedisLogger silences go-redis's own logging: ratectl reports errors once, as one
// line, and go-redis would print dial failures to stderr as well.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// readBuckets reads each bucket named in names, and Redis TIME, in one MULTI/EXEC, so
// all figures are of one instant on the buckets' own clock; limits[i] (nil when
// unknown) is the size of bucket i, and changed how long ago it last changed (0: not
// known). Its tokens now come from lua's own reader (TokenBucket.Inspect: the scripts'
// maths), not from a copy of the refill maths here. Nothing is written.
func readBuckets(ctx context.Context, rdb *redis.Client, names []string, limits []*bucketLimit, changed time.Duration) (bucketReport, error) {
	var (
		timeCmd *redis.TimeCmd
		values  = make([]*redis.StringCmd, len(names))
		ttls    = make([]*redis.DurationCmd, len(names))
	)
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		timeCmd = p.Time(ctx)
		for i, k := range names {
			values[i] = p.Get(ctx, k)
			ttls[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "WRONGTYPE") {
		return bucketReport{}, err
	}
	now := timeCmd.Val()
	rep := bucketReport{RedisTime: now.UTC(), Buckets: []bucketState{}}
	tb := lua.NewTokenBucket(rdb)
	for i, k := range names {
		b := bucketState{Key: k}
		limit := limits[i]
		switch v, err := values[i].Bytes(); {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return bucketReport{}, fmt.Errorf("key %s is not a bucket: %w", k, err)
		default:
			st, err := lua.DecodeStored(v)
			if err != nil {
				return bucketReport{}, fmt.Errorf("key %s is not a bucket: %w", k, err)
			}
			b.Exists = true
			full := st.Full.UTC()
			b.FullAt, b.StoredCapacity, b.StoredRefill = &full, &st.Capacity, &st.Refill
			if d := ttls[i].Val(); d >= 0 {
				ms := d.Milliseconds()
				b.TTLMillis = &ms
			}
		}
		if limit != nil {
			st, err := tb.Inspect(ctx, k, limit.Capacity, limit.RefillPerSecond, changed)
			if err != nil {
				return bucketReport{}, err
			}
			tn := roundTo(math.Max(0, st.Tokens), 3)
			full := st.ResetAfter.Milliseconds()
			b.TokensNow, b.FullInMillis = &tn, &full
		}
		rep.Buckets = append(rep.Buckets, b)
	}
	return rep, nil
}

func bucketTable(w io.Writer, rep bucketReport, shard *bucketLimit) {
	l := rep.Limit
	switch {
	case l == nil:
		fmt.Fprintf(w, "# bucket of %s/%s; size unknown (give --region or --capacity and --refill)\n", rep.Tenant, rep.Route)
	case l.Source == "database":
		fmt.Fprintf(w, "# bucket of %s/%s in %s: capacity %d, refill %s/s (share %s of the rule)\n",
			rep.Tenant, rep.Route, l.Region, l.Capacity, rateCell(l.RefillPerSecond), shareCell(l.Share))
	default:
		fmt.Fprintf(w, "# bucket of %s/%s: capacity %d, refill %s/s\n", rep.Tenant, rep.Route, l.Capacity, rateCell(l.RefillPerSecond))
	}
	if l != nil && l.Shards > 1 {
		if shard.Capacity*int64(l.Shards) == l.Capacity {
			fmt.Fprintf(w, "# %d shards, each capacity %d, refill %s/s\n", l.Shards, shard.Capacity, rateCell(shard.RefillPerSecond))
		} else {
			fmt.Fprintf(w, "# %d shards, capacity %d or %d (the first %d hold one more), refill %s/s each\n", l.Shards,
				shard.Capacity+1, shard.Capacity, l.Capacity-shard.Capacity*int64(l.Shards), rateCell(shard.RefillPerSecond))
		}
	}
	fmt.Fprintf(w, "# redis time %s\n", rep.RedisTime.Format(time.RFC3339Nano))
	for i, b := range rep.Buckets {
		if i > 0 {
			fmt.Fprintln(w)
		}
		row(w, "KEY", b.Key)
		switch {
		case b.BandLimit != nil:
			row(w, "BAND", b.Band+": capacity "+strconv.FormatInt(b.BandLimit.Capacity, 10)+", refill "+rateCell(b.BandLimit.RefillPerSecond)+"/s")
		case b.Band != "":
			row(w, "BAND", b.Band+" (the rule's own)")
		}
		if !b.Exists {
			row(w, "EXISTS", "no (a missing bucket is full, unless a raise of the limit holds it back)")
		} else {
			row(w, "EXISTS", "yes")
			row(w, "STORED RULE", "capacity "+strconv.FormatFloat(*b.StoredCapacity, 'f', -1, 64)+", refill "+strconv.FormatFloat(*b.StoredRefill, 'f', -1, 64)+"/s")
			when := "full since"
			if b.FullAt.After(rep.RedisTime) {
				when = "full at"
			}
			row(w, strings.ToUpper(when), b.FullAt.Format(time.RFC3339Nano)+" ("+b.FullAt.Sub(rep.RedisTime).Round(time.Millisecond).String()+" from now)")
			row(w, "TTL", msCell(b.TTLMillis))
		}
		if b.TokensNow != nil {
			row(w, "TOKENS NOW", tokenCell(b.TokensNow))
			row(w, "FULL IN", msCell(b.FullInMillis))
		}
		if b.HeldTo != nil {
			row(w, "HELD TO", tokenCell(b.HeldTo)+" by a raise "+msCell(b.RaisedAgoMillis)+" ago (the old limit plus the refill since; the gateways take the lower)")
		}
	}
}

func tokenCell(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
}

func msCell(v *int64) string {
	if v == nil {
		return "-"
	}
	return (time.Duration(*v) * time.Millisecond).String()
}
