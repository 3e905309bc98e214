package regions

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // quota zones load on any machine, a distroless image included
)

// Wildcard is the tenant or route id of a default rule, and the scope of a region-wide share.
const Wildcard = "*"

// OtherLabel is the tenant and route label of ratelimit_tenant_requests_total under which
// gateways count the pairs without series of their own; it has no scope.
const OtherLabel = "_other"

// ErrInvalid is wrapped by every validation error of this package, so callers can tell
// bad input from a failed operation.
var ErrInvalid = errors.New("invalid")

// ValidateID checks a tenant, route or region id: [A-Za-z0-9._-]{1,64}. kind names the id
// in the error ("tenant", "route", "region"). A tenant or route may not be OtherLabel:
// its series would merge with those of every untracked pair.
func ValidateID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("%w %s id: empty", ErrInvalid, kind)
	}
	if len(id) > 64 {
		return fmt.Errorf("%w %s id %.20q...: longer than 64 characters", ErrInvalid, kind, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w %s id %q: only letters, digits, '.', '_' and '-' are allowed", ErrInvalid, kind, id)
		}
	}
	if id == OtherLabel && (kind == "tenant" || kind == "route") {
		return fmt.Errorf("%w %s id %q: reserved for metrics (the series of untracked tenants)", ErrInvalid, kind, id)
	}
	return nil
}

// ValidateIDOrWildcard accepts an id (ValidateID) or "*".
func ValidateIDOrWildcard(kind, id string) error {
	if id == Wildcard {
		return nil
	}
	return ValidateID(kind, id)
}

// Rule is a tenant's token bucket for one route. Tenant or Route "*" make it a default.
// A plan's rule (Plan set) has Tenant "*": it applies to every tenant of the plan, each
// with buckets of its own (a plan is a template, never a shared bucket).
type Rule struct {
	Tenant string
	Route  string
	// Capacity is the burst: the most tokens the bucket holds. > 0.
	Capacity int64
	// RefillPerSecond is the sustained rate; it may be fractional. > 0.
	RefillPerSecond float64
	// Shadow rules never reject; the gateway counts what they would have rejected.
	Shadow bool
	// Shards splits the bucket into that many sub-buckets (hot keys). >= 1.
	Shards    int
	UpdatedAt time.Time
	// Plan is the plan whose rule this is; "" for a tenant's own rule or a default. Not
	// a column of rate_limit_rule (db:"-"), and left out of JSON when empty, so the
	// fingerprint of rules without plans is what it was.
	Plan string `db:"-" json:",omitempty"`
	// Bands are the rule's further token buckets (at most MaxBands, each named): a
	// request is admitted only if the rule's own bucket (the band named PrimaryBand,
	// Capacity and RefillPerSecond) and every band admit, in one script call, and then
	// its cost is taken from each. Every band is scaled by the region's share. Empty
	// for a rule of one band, which behaves as a rule did before bands; left out of JSON
	// when empty, so the fingerprint of such rules is what it was.
	Bands []Band `db:"-" json:",omitempty"`
}

// Equal reports whether r and o are the same rule, bands included (in order).
func (r Rule) Equal(o Rule) bool {
	return r.Tenant == o.Tenant && r.Route == o.Route && r.Capacity == o.Capacity &&
		r.RefillPerSecond == o.RefillPerSecond && r.Shadow == o.Shadow && r.Shards == o.Shards &&
		r.UpdatedAt.Equal(o.UpdatedAt) && r.Plan == o.Plan && slices.Equal(r.Bands, o.Bands)
}

// Band is one further limit of a rule: a token bucket ("10,000 per hour, refilled
// smoothly" is Capacity 10000, RefillPerSecond 10000/3600), or a calendar quota when
// Period is set ("1,000,000 per calendar month" is Capacity 1000000, Period "month"):
// an amount per period, reset at each period boundary in Zone, and one budget for the
// whole fleet that the regions split by usage and share (Allowance).
type Band struct {
	// Name is the band's stable name (an id, not PrimaryBand), shown in RateLimit-Policy.
	Name string `json:"name"`
	// Capacity (1..MaxCapacity) and RefillPerSecond (0 < r <= MaxRefillPerSecond), as a
	// rule's. A quota's Capacity is its amount per period and its RefillPerSecond 0.
	Capacity        int64   `json:"capacity"`
	RefillPerSecond float64 `json:"refill_per_second"`
	// Period makes the band a calendar quota: PeriodHour, PeriodDay, PeriodWeek or
	// PeriodMonth; "" for a token bucket. Left out of JSON when empty, so the
	// fingerprint of token-bucket bands is what it was.
	Period Period `json:"period,omitempty"`
	// Zone is the IANA time zone whose calendar a quota's periods follow ("" is UTC);
	// "" for a token bucket.
	Zone string `json:"zone,omitempty"`
}

// Quota reports whether b is a calendar quota (Period set), not a token bucket.
func (b Band) Quota() bool { return b.Period != "" }

// Limit is b's capacity and refill, unscaled (a quota's refill is 0).
func (b Band) Limit() Limit { return Limit{Capacity: b.Capacity, RefillPerSecond: b.RefillPerSecond} }

// Period is the calendar period of a quota band.
type Period string

// The periods of a quota. Every period starts on its calendar boundary in the band's
// zone: the hour (:00 local), the day (00:00), the ISO week (Monday 00:00), the month
// (the 1st, 00:00).
const (
	PeriodHour  Period = "hour"
	PeriodDay   Period = "day"
	PeriodWeek  Period = "week"
	PeriodMonth Period = "month"
)

// Periods are the valid periods, shortest first.
var Periods = []Period{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth}

// Window is the period of quota band b that holds t: [start, end), end the next
// period's start. An hour is one hour of absolute time, starting at the zone's :00; a
// day, week or month starts at local midnight and may be 23 or 25 hours a day long
// across a daylight-saving change. b must be valid (its zone loads); a zone that does
// not load is read as UTC.
func (b Band) Window(t time.Time) (start, end time.Time) {
	lt := t.In(Location(b.Zone))
	y, m, d := lt.Date()
	switch b.Period {
	case PeriodHour:
		start = lt.Add(-time.Duration(lt.Minute())*time.Minute - time.Duration(lt.Second())*time.Second - time.Duration(lt.Nanosecond()))
		return start, start.Add(time.Hour)
	case PeriodWeek:
		back := (int(lt.Weekday()) + 6) % 7 // days since Monday
		start = time.Date(y, m, d-back, 0, 0, 0, 0, lt.Location())
		return start, time.Date(y, m, d-back+7, 0, 0, 0, 0, lt.Location())
	case PeriodMonth:
		start = time.Date(y, m, 1, 0, 0, 0, 0, lt.Location())
		return start, time.Date(y, m+1, 1, 0, 0, 0, 0, lt.Location())
	default: // PeriodDay
		start = time.Date(y, m, d, 0, 0, 0, 0, lt.Location())
		return start, time.Date(y, m, d+1, 0, 0, 0, 0, lt.Location())
	}
}

var zones sync.Map // zone name -> *time.Location

// Location is the time zone named zone ("" and "UTC" are UTC), loaded once (the
// binaries embed the zone database: time/tzdata); UTC for a name that does not load
// (Validate refuses such a band).
func Location(zone string) *time.Location {
	if zone == "" || zone == "UTC" {
		return time.UTC
	}
	if l, ok := zones.Load(zone); ok {
		return l.(*time.Location)
	}
	l, err := time.LoadLocation(zone)
	if err != nil {
		return time.UTC
	}
	zones.Store(zone, l)
	return l
}

// Allowance is how far a region's counter of a quota may go this period: what the
// region has used (mine, as the control plane last counted it) plus its share of what
// the whole fleet has left of budget (budget - total, total counting every region,
// mine included), rounded down; never below mine. The allowances of all regions add up
// to the budget when they are computed from one count and shares that add up to 1; a
// region that admits only within its allowance admits nothing once the count it was
// computed from reaches the budget (docs/reliability.md, "Calendar quotas").
func Allowance(budget int64, share float64, mine, total int64) int64 {
	left := budget - total
	if left <= 0 || !(share > 0) {
		return mine
	}
	a := math.Floor(float64(left) * min(share, 1))
	if a > float64(MaxCapacity-mine) {
		return MaxCapacity
	}
	return mine + int64(a)
}

// PrimaryBand is the name of a rule's own bucket (Rule.Capacity, Rule.RefillPerSecond)
// among its bands: in RateLimit-Policy, limits files and ratectl.
const PrimaryBand = "rate"

// MaxBands is the most further bands a rule may have (besides its own bucket).
const MaxBands = 8

// BandLimit is one band of a rule as a region enforces it: a token bucket scaled by
// its share, or a quota's counter for this period (Quota set).
type BandLimit struct {
	Name string
	// Limit is a token bucket's capacity and refill, scaled. For a quota, Capacity is
	// the region's allowance (Allowance; 0 when nothing is left) and RefillPerSecond 0.
	Limit Limit
	// Quota is a quota's period and what it is counted against; nil for a token bucket.
	Quota *QuotaCounter
}

// QuotaCounter is the period of a quota band that a decision falls in, and the region's
// counter for it.
type QuotaCounter struct {
	// Start and End are the period (Band.Window): the counter is one per period, its
	// key named by Start, and End is when a refused request may try again.
	Start, End time.Time
	// Floor is the region's usage this period as the control plane last counted it: the
	// counter holds at least this much, so a counter Redis lost is not a fresh one.
	Floor int64
	// Policy is the band's amount scaled by the share (Limit.Scale), the amount that
	// RateLimit-Policy shows: steady while the allowance moves with usage.
	Policy int64
	// Grow is the most the region's allowance can still grow this period as counted: its
	// share of what the whole fleet has left, rounded down (0 once that is spent, or too
	// small to give it a whole unit).
	Grow int64
	// Retry, when > 0, is how soon a request refused on the allowance may try again
	// while Grow covers its cost: the allowance grows as the count does (the gateway's
	// next syncs). Otherwise, and when 0: at the period's end.
	Retry time.Duration
}

// QuotaUsage is what the control plane has counted of one period of a quota: this
// region's usage and the whole fleet's (this region's included).
type QuotaUsage struct {
	Mine, Total int64
}

// QuotaKey names one period of one quota band of a tenant's route: the unit the
// regions' usage is counted in (one Redis counter per region, one row per region in the
// store).
type QuotaKey struct {
	Tenant, Route, Band string
	// Start is the period's start (Band.Window), in Unix seconds.
	Start int64
}

// QuotaLookback is how far back a read of quota usage goes: the longest period (a month
// of 31 days) and a day, so every period still running is read.
const QuotaLookback = 32 * 24 * time.Hour

// QuotaReport is a region's usage of one quota period as its counter last showed it:
// counters only grow, so a report is never below an earlier one of the same counter.
type QuotaReport struct {
	QuotaKey
	Used int64
}

// ScaledBands are r's further bands as a region with share enforces them at now, in
// order; nil for a rule of one band. A token bucket is scaled (Limit.Scale); a quota is
// its period holding now, with the allowance of its usage (Allowance): usage gives what
// the control plane has counted of a band's period, by the period's start.
func (r Rule) ScaledBands(share float64, now time.Time, usage func(band string, start time.Time) QuotaUsage) []BandLimit {
	if len(r.Bands) == 0 {
		return nil
	}
	out := make([]BandLimit, len(r.Bands))
	for i, b := range r.Bands {
		if !b.Quota() {
			out[i] = BandLimit{Name: b.Name, Limit: b.Limit().Scale(share)}
			continue
		}
		start, end := b.Window(now)
		var u QuotaUsage
		if usage != nil {
			u = usage(b.Name, start)
		}
		allowance := Allowance(b.Capacity, share, u.Mine, u.Total)
		q := &QuotaCounter{Start: start, End: end, Floor: u.Mine, Policy: b.Limit().Scale(share).Capacity, Grow: allowance - u.Mine}
		out[i] = BandLimit{Name: b.Name, Limit: Limit{Capacity: allowance}, Quota: q}
	}
	return out
}

// validateBands checks r's further bands: ids, unique, not PrimaryBand, numbers in range.
func (r Rule) validateBands(what, owner string) error {
	if len(r.Bands) > MaxBands {
		return fmt.Errorf("%w %s %s/%s: %d bands, at most %d besides the rule's own (%q)", ErrInvalid, what, owner, r.Route, len(r.Bands), MaxBands, PrimaryBand)
	}
	seen := make(map[string]bool, len(r.Bands))
	for _, b := range r.Bands {
		if err := ValidateID("band", b.Name); err != nil {
			return fmt.Errorf("%s %s/%s: %w", what, owner, r.Route, err)
		}
		if strings.EqualFold(b.Name, PrimaryBand) {
			return fmt.Errorf("%w %s %s/%s: band %q is the name of the rule's own capacity and refill", ErrInvalid, what, owner, r.Route, b.Name)
		}
		if seen[b.Name] {
			return fmt.Errorf("%w %s %s/%s: band %q appears twice", ErrInvalid, what, owner, r.Route, b.Name)
		}
		seen[b.Name] = true
		if b.Capacity <= 0 || b.Capacity > MaxCapacity {
			return fmt.Errorf("%w %s %s/%s: band %s: capacity %d must be between 1 and %d", ErrInvalid, what, owner, r.Route, b.Name, b.Capacity, int64(MaxCapacity))
		}
		if b.Quota() {
			if err := b.validateQuota(); err != nil {
				return fmt.Errorf("%w %s %s/%s: band %s: %w", ErrInvalid, what, owner, r.Route, b.Name, err)
			}
			continue
		}
		if b.Zone != "" {
			return fmt.Errorf("%w %s %s/%s: band %s: zone %q is for a calendar quota (a period), not a token bucket", ErrInvalid, what, owner, r.Route, b.Name, b.Zone)
		}
		if !(b.RefillPerSecond > 0) || b.RefillPerSecond > MaxRefillPerSecond {
			return fmt.Errorf("%w %s %s/%s: band %s: refill_per_second %v must be > 0 and at most %g", ErrInvalid, what, owner, r.Route, b.Name, b.RefillPerSecond, float64(MaxRefillPerSecond))
		}
	}
	return nil
}

// validateQuota checks a quota band's period, zone and refill (0).
func (b Band) validateQuota() error {
	if !slices.Contains(Periods, b.Period) {
		return fmt.Errorf("period %q: want hour, day, week or month", b.Period)
	}
	if b.RefillPerSecond != 0 {
		return fmt.Errorf("a calendar quota (period %s) has no refill_per_second, got %v", b.Period, b.RefillPerSecond)
	}
	if b.Zone != "" {
		// Go's database has a few names that are files, not zones, and that PostgreSQL's
		// pg_timezone_names (the database's check) does not list.
		special := b.Zone == "Local" || b.Zone == "localtime" || b.Zone == "posixrules" || b.Zone == "Factory" ||
			strings.HasPrefix(b.Zone, "posix/") || strings.HasPrefix(b.Zone, "right/")
		if _, err := time.LoadLocation(b.Zone); err != nil || special || strings.HasPrefix(b.Zone, "/") {
			return fmt.Errorf("zone %q: want an IANA time zone like Europe/Berlin, or none for UTC", b.Zone)
		}
	}
	return nil
}

// Plan is a named set of per-route rules that many tenants share (free, pro): a tenant
// assigned to it gets the plan's rule for a route unless it has a rule of its own (the
// order is Snapshot.Rule's). Rules have Plan set to Name and Tenant "*".
type Plan struct {
	Name  string
	Rules []Rule
}

// TenantPlan assigns a tenant to a plan.
type TenantPlan struct {
	Tenant string
	Plan   string
}

// MaxShards is the most sub-buckets a rule may be split into.
const MaxShards = 1024

// Validate checks ids and numbers.
func (r Rule) Validate() error {
	if err := ValidateIDOrWildcard("tenant", r.Tenant); err != nil {
		return err
	}
	if r.Plan != "" {
		if err := ValidateID("plan", r.Plan); err != nil {
			return err
		}
		if r.Tenant != Wildcard {
			return fmt.Errorf("%w rule of plan %s/%s: tenant %q: a plan's rule is for every tenant of the plan (*)", ErrInvalid, r.Plan, r.Route, r.Tenant)
		}
	}
	if err := ValidateIDOrWildcard("route", r.Route); err != nil {
		return err
	}
	// A plan's rule is named as the plan's (pro/orders), not as the default rule */orders.
	what, owner := "rule", r.Tenant
	if r.Plan != "" {
		what, owner = "rule of plan", r.Plan
	}
	if r.Capacity <= 0 || r.Capacity > MaxCapacity {
		return fmt.Errorf("%w %s %s/%s: capacity %d must be between 1 and %d", ErrInvalid, what, owner, r.Route, r.Capacity, int64(MaxCapacity))
	}
	if !(r.RefillPerSecond > 0) || r.RefillPerSecond > MaxRefillPerSecond {
		return fmt.Errorf("%w %s %s/%s: refill_per_second %v must be > 0 and at most %g", ErrInvalid, what, owner, r.Route, r.RefillPerSecond, float64(MaxRefillPerSecond))
	}
	if r.Shards < 1 || r.Shards > MaxShards {
		return fmt.Errorf("%w %s %s/%s: shards %d must be between 1 and %d", ErrInvalid, what, owner, r.Route, r.Shards, MaxShards)
	}
	if len(r.Bands) > 0 && r.Shards > 1 {
		return fmt.Errorf("%w %s %s/%s: a rule with bands cannot be sharded (shards %d): its buckets are decided in one script call, in the tenant's slot", ErrInvalid, what, owner, r.Route, r.Shards)
	}
	return r.validateBands(what, owner)
}

// Upper bounds of a rule. The shared bucket counts tokens in Lua doubles: every whole
// count up to 2^53 (about 9e15) is exact, so MaxCapacity tokens, or a bucket that much in
// debt, lose none; MaxRefillPerSecond keeps a refill over any elapsed time a finite
// double. They equal lua.MaxCapacity and lua.MaxRefill (gateway/limiter tests it).
// There is no "unlimited" rule: a capacity at the bound is as good as unlimited.
const (
	MaxCapacity        = 1_000_000_000_000_000
	MaxRefillPerSecond = 1_000_000_000_000
)

// Limit is a token bucket's size after scaling: what one region, or one instance of it,
// enforces. Its JSON names are ratectl's (`bucket inspect`, `shares get`).
type Limit struct {
	Capacity        int64   `json:"capacity"`
	RefillPerSecond float64 `json:"refill_per_second"`
}

// MinScaleShare is the smallest share Scale applies. A share of 0 (allowed in the data:
// a region added under an operator override gets 0 until the override is set again) is
// served as this, so the scaled limit stays a valid, tiny bucket — never a refill of 0,
// which the limiter would refuse, and never "unlimited".
const MinScaleShare = 1e-4

// Scale returns the part of a bucket that a share (0..1] of it gets:
// capacity max(1, round(capacity*share)), refill refill*share, with share at least
// MinScaleShare. A capacity too small to split keeps one token, so a limit
// never becomes "reject everything". The result saturates at MaxCapacity and
// MaxRefillPerSecond: a capacity of math.MaxInt64 never wraps around to 1 token.
func Scale(capacity int64, refill float64, share float64) Limit {
	return Limit{Capacity: capacity, RefillPerSecond: refill}.Scale(share)
}

// Scale is the package function Scale on l.
// FillTime is how long an empty bucket of l takes to fill (the same at any share), at
// most about 292 years (the largest time.Duration).
func (l Limit) FillTime() time.Duration {
	s := float64(l.Capacity) / l.RefillPerSecond
	if !(s < float64(math.MaxInt64)/float64(time.Second)) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

func (l Limit) Scale(share float64) Limit {
	if !(share >= MinScaleShare) { // also catches NaN
		share = MinScaleShare
	}
	c := math.Round(float64(l.Capacity) * share)
	switch {
	case c < 1:
		c = 1
	case c > MaxCapacity:
		c = MaxCapacity
	}
	r := l.RefillPerSecond * share
	if r > MaxRefillPerSecond {
		r = MaxRefillPerSecond
	}
	return Limit{Capacity: int64(c), RefillPerSecond: r}
}

// ShardCount is how many sub-buckets l split into shards actually uses: shards, but
// never more than the capacity (each shard holds at least one token). 0 and 1 mean
// unsharded and return 1.
func (l Limit) ShardCount(shards int) int {
	if shards <= 1 {
		return 1
	}
	if int64(shards) > l.Capacity {
		return int(max(l.Capacity, 1))
	}
	return shards
}

// Shard is the part of l that shard i of k holds: capacity/k tokens, the remainder going
// one token each to the first shards, so the shards' capacities add up to l.Capacity
// exactly; and refill/k. k comes from ShardCount, so every shard holds at least one token.
func (l Limit) Shard(k, i int) Limit {
	if k <= 1 {
		return l
	}
	base, rem := l.Capacity/int64(k), l.Capacity%int64(k)
	c := base
	if int64(i) < rem {
		c++
	}
	return Limit{Capacity: c, RefillPerSecond: l.RefillPerSecond / float64(k)}
}

// Scope is what a share applies to: every rule ("*"), one tenant ("shop-a"), or one
// tenant's rule for one route ("shop-a/create-order").
type Scope struct {
	Tenant string // "*" for the region-wide default
	Route  string // "*" unless the scope is one rule
}

// GlobalScope is the region-wide default scope "*".
var GlobalScope = Scope{Tenant: Wildcard, Route: Wildcard}

// ParseScope reads "*", "TENANT" or "TENANT/ROUTE".
func ParseScope(s string) (Scope, error) {
	if s == Wildcard {
		return GlobalScope, nil
	}
	tenant, route, hasRoute := strings.Cut(s, "/")
	if err := ValidateID("tenant", tenant); err != nil {
		return Scope{}, fmt.Errorf("scope %q: %w", s, err)
	}
	if !hasRoute {
		return Scope{Tenant: tenant, Route: Wildcard}, nil
	}
	if err := ValidateID("route", route); err != nil {
		return Scope{}, fmt.Errorf("scope %q: %w", s, err)
	}
	return Scope{Tenant: tenant, Route: route}, nil
}

// Validate checks the scope's ids: "*" (both parts "*"), a tenant with route "*" (or ""),
// or a tenant and a route.
func (s Scope) Validate() error {
	if s.Tenant == Wildcard {
		if s.Route != Wildcard && s.Route != "" {
			return fmt.Errorf("%w scope */%s: a route scope needs a tenant", ErrInvalid, s.Route)
		}
		return nil
	}
	if err := ValidateID("tenant", s.Tenant); err != nil {
		return fmt.Errorf("scope: %w", err)
	}
	if s.Route == Wildcard || s.Route == "" {
		return nil
	}
	if err := ValidateID("route", s.Route); err != nil {
		return fmt.Errorf("scope: %w", err)
	}
	return nil
}

// normal is the scope with an empty Route written as "*", the form used as a map key.
func (s Scope) normal() Scope {
	if s.Route == "" || s.Tenant == Wildcard {
		s.Route = Wildcard
	}
	return s
}

// String is the stored form: "*", "TENANT" or "TENANT/ROUTE".
func (s Scope) String() string {
	switch {
	case s.Tenant == Wildcard:
		return Wildcard
	case s.Route == Wildcard || s.Route == "":
		return s.Tenant
	default:
		return s.Tenant + "/" + s.Route
	}
}

// Source says who set a share.
type Source string

const (
	SourceOverride   Source = "override"   // an operator, through ratectl
	SourceRebalancer Source = "rebalancer" // the rebalancer job
	SourceDefault    Source = "default"    // neither: an equal split
)

// Share is one region's fraction of the limits in one scope.
type Share struct {
	Scope  Scope
	Region string
	Share  float64 // 0..1
	Source Source  // override or rebalancer
	// ExpiresAt is when an override stops applying; zero means never.
	ExpiresAt time.Time
	UpdatedAt time.Time
	// Reason is why the share was set (an operator's --reason, or the rebalancer's).
	Reason string
}

// Active reports whether the share applies at now.
func (s Share) Active(now time.Time) bool { return s.ExpiresAt.IsZero() || now.Before(s.ExpiresAt) }

// ShareTolerance is how far from 1 a set of shares may sum.
const ShareTolerance = 1e-6

// ValidateShares checks one scope's shares: every region named exactly once, each share in
// [0, 1], and the sum 1 within ShareTolerance.
func ValidateShares(shares map[string]float64, regions []string) error {
	known := make(map[string]bool, len(regions))
	for _, r := range regions {
		known[r] = true
	}
	sum := 0.0
	for r, v := range shares {
		if !known[r] {
			return fmt.Errorf("%w shares: unknown region %q", ErrInvalid, r)
		}
		if math.IsNaN(v) || v < 0 || v > 1 {
			return fmt.Errorf("%w shares: region %s share %v must be between 0 and 1", ErrInvalid, r, v)
		}
		sum += v
	}
	for _, r := range regions {
		if _, ok := shares[r]; !ok {
			return fmt.Errorf("%w shares: region %s has no share (name every region)", ErrInvalid, r)
		}
	}
	if math.Abs(sum-1) > ShareTolerance {
		return fmt.Errorf("%w shares: they sum to %.6g, not 1", ErrInvalid, sum)
	}
	return nil
}

// KeyHash is the SHA-256 of an API key; only this is stored and held in memory.
type KeyHash [sha256.Size]byte

// HashKey hashes an API key as presented by a client.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// APIKey is a stored key: its hash, never the secret.
type APIKey struct {
	ID        int64
	Hash      KeyHash
	Tenant    string
	Label     string
	CreatedAt time.Time
	RevokedAt time.Time // zero while the key is valid
}

// MarshalJSON writes the key as ratectl prints it (`keys list -o json`, a public
// contract): id, tenant, label, created_at and revoked_at (null while the key is valid),
// times in UTC. Never the hash.
func (k APIKey) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID        int64      `json:"id"`
		Tenant    string     `json:"tenant"`
		Label     string     `json:"label"`
		CreatedAt time.Time  `json:"created_at"`
		RevokedAt *time.Time `json:"revoked_at"`
	}{k.ID, k.Tenant, k.Label, k.CreatedAt.UTC(), nullTime(k.RevokedAt)})
}

// nullTime is t in UTC, or nil (JSON null) when t is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// Instance is a gateway process that heartbeats into a region.
type Instance struct {
	ID       string
	Region   string
	LastSeen time.Time
	// SnapshotXmin is the transaction horizon of the snapshot it enforced at its last
	// heartbeat (Snapshot.Xmin): it applies every change committed by a transaction
	// below it. 0: unknown.
	SnapshotXmin int64
}
