package torture

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
)

// Target is a gateway the load is sent to, by each of its doors.
type Target struct {
	Gateway, Region string
	// URL is the gateway's proxy; Check the nginx in front of its /v1/check ("" when it
	// has none); RLS its Envoy rate-limit service (host:port).
	URL, Check, RLS string
}

// Door is the way a request reaches the limiter.
type Door int

// The doors of DESIGN.md ("Beside other proxies").
const (
	DoorProxy Door = iota // the gateway's own reverse proxy
	DoorCheck             // nginx (deploy/nginx as shipped) asking the gateway's /v1/check
	DoorRLS               // the gateway's Envoy RLS v3 gRPC service, as Envoy calls it
)

func (d Door) String() string {
	switch d {
	case DoorCheck:
		return "nginx+check"
	case DoorRLS:
		return "rls"
	}
	return "proxy"
}

// Spelling is one way a hostile client writes a request of its route.
type Spelling struct {
	// Path is the HTTP request target exactly as sent (a fragment, a ;param, %2F, dot
	// segments and case included); Route the RLS route entry.
	Path, Route string
	// Value is the stack.ValueHeader header (HTTP) or descriptor entry (RLS) of a
	// per-value route; "" sends none.
	Value string
	// XFF is a forged X-Forwarded-For (HTTP) or the remote_address entry (RLS); ""
	// sends none.
	XFF string
}

func (s Spelling) String() string {
	var parts []string
	if s.Path != "" {
		parts = append(parts, fmt.Sprintf("path %q", s.Path))
	}
	if s.Route != "" {
		parts = append(parts, fmt.Sprintf("route %q", s.Route))
	}
	if s.Value != "" {
		parts = append(parts, fmt.Sprintf("value %q", s.Value))
	}
	if s.XFF != "" {
		parts = append(parts, fmt.Sprintf("xff %q", s.XFF))
	}
	return strings.Join(parts, " ")
}

// Flow is one tenant's load on every gateway it is sent to, by one door.
type Flow struct {
	Tenant, Key string
	// Rate is the requests per second sent to each gateway.
	Rate float64
	// Gateways limits the flow to these gateway ids; when empty it goes to every
	// gateway that has its door (of Region, when set), those added later included.
	Gateways []string
	Region   string
	// Path is the request path (default /orders); Cost the tokens one request of it
	// takes (default 1), what an admission counts for.
	Path string
	Cost int
	// Hostile requests try to strip or double the tenant header the gateway sets for the
	// upstream (issue 14 item 7): "Connection: X-Tenant-Id" (a hop-by-hop header list
	// that a reverse proxy strips), "X-Tenant-Id: victim" and "X-Tenant_Id: victim".
	Hostile bool
	// Door is how the requests reach the limiter (default the proxy).
	Door Door
	// Start is how long after the load starts the flow sends its first request; Stop,
	// when set, how long after it the flow sends its last (a tenant's traffic that moves
	// from one region to another is two flows, one stopping as the other starts).
	Start, Stop time.Duration
	// Spellings, when set, are sent in turn (request i as Spellings[i mod n]): a hostile
	// client's ways of writing one route, one key and one client value (issue 21). Every
	// one admitted counts against the tenant's rule for the route it is loaded on, so a
	// spelling that escapes to another bucket shows as a breach; a refusal must be a 4xx
	// (an RLS OVER_LIMIT or InvalidArgument), never a 5xx.
	Spellings []Spelling
}

// Victim is the tenant a hostile request claims to be.
const Victim = "victim"

// maxInFlight bounds the requests one flow has open against one gateway; a tick that
// finds it reached sends nothing and is counted as skipped (client-side pacing, not a
// failure).
const maxInFlight = 32

// requestTimeout bounds every request: a request without an answer by then is a
// client-side error, which fails the run.
const requestTimeout = 10 * time.Second

// spellKey names one door and spelling of a tenant, for the spelling table.
type spellKey struct {
	tenant string
	door   Door
	spell  string
}

// spellCounts are the answers one spelling got: by status, and the X-RateLimit-Limit
// values of its decisions (which rule it was decided under).
type spellCounts struct {
	codes  map[int]int
	limits map[string]bool
}

// Recorder counts every answer: the admitted requests with their send and receive time
// per tenant and region, the status codes per tenant, and every client-side error. It is
// safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	admitted map[string]map[string][]Admission
	// throttled are the send times of each tenant's 429s.
	throttled map[string][]time.Time
	codes     map[string]map[int]int
	// refused are the 3xx and 4xx answers of spelled requests, which may refuse a
	// spelling (their 5xx count as any 5xx; an RLS error other than InvalidArgument
	// counts as a 500).
	refused int
	spells  map[spellKey]*spellCounts
	errs    []string
	nErrs   int
	skipped int
	// undecided are answers without X-RateLimit-Limit (the gateway failed open), and
	// identity answers whose upstream saw another tenant header than the flow's own.
	undecided, identity int
	problems            []string
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{admitted: map[string]map[string][]Admission{}, throttled: map[string][]time.Time{}, codes: map[string]map[int]int{}, spells: map[spellKey]*spellCounts{}}
}

// problem records an answer that broke a per-request promise (kind: "undecided" or
// "identity").
func (r *Recorder) problem(kind, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kind == "identity" {
		r.identity++
	} else {
		r.undecided++
	}
	if len(r.problems) < 20 {
		r.problems = append(r.problems, kind+": "+fmt.Sprintf(format, args...))
	}
}

// answer records one answer. A spelled request (sp non-nil) that is refused with a 3xx
// or 4xx counts as refused, not as an unexpected status.
func (r *Recorder) answer(f Flow, region, gateway string, sp *Spelling, code int, limit string, sent, recv time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tenant, cost := f.Tenant, cmp.Or(f.Cost, 1)
	if sp != nil {
		k := spellKey{tenant, f.Door, sp.String()}
		c := r.spells[k]
		if c == nil {
			c = &spellCounts{codes: map[int]int{}, limits: map[string]bool{}}
			r.spells[k] = c
		}
		c.codes[code]++
		if limit != "" {
			c.limits[limit] = true
		}
		if code < 500 && code != http.StatusOK && code != http.StatusTooManyRequests {
			r.refused++
			return
		}
	}
	if r.codes[tenant] == nil {
		r.codes[tenant] = map[int]int{}
	}
	r.codes[tenant][code]++
	if code == http.StatusTooManyRequests {
		r.throttled[tenant] = append(r.throttled[tenant], sent)
	}
	if code == http.StatusOK {
		if r.admitted[tenant] == nil {
			r.admitted[tenant] = map[string][]Admission{}
		}
		r.admitted[tenant][region] = append(r.admitted[tenant][region], Admission{Sent: sent, Recv: recv, Cost: cost, Gateway: gateway})
	}
}

// note keeps an error for the report without counting it (its answer is counted).
func (r *Recorder) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

func (r *Recorder) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nErrs++
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

func (r *Recorder) skip() {
	r.mu.Lock()
	r.skipped++
	r.mu.Unlock()
}

// Admitted copies the admissions (tenant -> region -> admissions).
func (r *Recorder) Admitted() map[string]map[string][]Admission {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string][]Admission{}
	for t, m := range r.admitted {
		out[t] = map[string][]Admission{}
		for reg, a := range m {
			out[t][reg] = append([]Admission(nil), a...)
		}
	}
	return out
}

// Throttled are the send times of tenant's 429s.
func (r *Recorder) Throttled(tenant string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.throttled[tenant]...)
}

// Total is the tokens admitted to tenant (all regions: requests x their cost), optionally
// only for requests sent at or after since.
func (r *Recorder) Total(tenant string, since time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, a := range r.admitted[tenant] {
		for _, x := range a {
			if !x.Sent.Before(since) {
				n += x.Tokens()
			}
		}
	}
	return n
}

// Spellings is the spelling table: per tenant, door and spelling, the answers by status
// and the limits they were decided under, one line each.
func (r *Recorder) Spellings() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]spellKey, 0, len(r.spells))
	for k := range r.spells {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.tenant != b.tenant {
			return a.tenant < b.tenant
		}
		if a.door != b.door {
			return a.door < b.door
		}
		return a.spell < b.spell
	})
	var out []string
	for _, k := range keys {
		c := r.spells[k]
		limits := make([]string, 0, len(c.limits))
		for l := range c.limits {
			limits = append(limits, l)
		}
		sort.Strings(limits)
		out = append(out, fmt.Sprintf("%s via %s, %s: %v, X-RateLimit-Limit %v", k.tenant, k.door, k.spell, c.codes, limits))
	}
	return out
}

// Summary is what the recorder saw.
type Summary struct {
	Codes map[string]map[int]int // tenant -> status -> count
	// Requests, Status5xx and Unexpected (a status other than 200 and 429, and not a
	// spelled request's refusal) over all tenants; ClientErrors are requests without an
	// answer (transport error, timeout); Refused the spelled requests refused with a 3xx
	// or 4xx.
	Requests, Status5xx, Unexpected, ClientErrors, Skipped, Refused int
	Errors                                                          []string
	// Undecided are 200s and 429s without X-RateLimit-Limit (the limiter did not decide:
	// the gateway failed open); Identity are 200s whose upstream saw a tenant header
	// other than exactly the flow's tenant. Problems are the first of both.
	Undecided, Identity int
	Problems            []string
}

// Summary totals the counts.
func (r *Recorder) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Summary{Codes: map[string]map[int]int{}, ClientErrors: r.nErrs, Skipped: r.skipped, Errors: append([]string(nil), r.errs...),
		Undecided: r.undecided, Identity: r.identity, Problems: append([]string(nil), r.problems...), Refused: r.refused}
	s.Requests = r.refused
	for t, m := range r.codes {
		s.Codes[t] = map[int]int{}
		for c, n := range m {
			s.Codes[t][c] = n
			s.Requests += n
			switch {
			case c >= 500:
				s.Status5xx += n
				s.Unexpected += n
			case c != http.StatusOK && c != http.StatusTooManyRequests:
				s.Unexpected += n
			}
		}
	}
	return s
}

func (s Summary) String() string {
	var tenants []string
	for t := range s.Codes {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests, %d 5xx, %d other unexpected, %d spellings refused (3xx/4xx), %d client errors, %d undecided, %d tenant header breaches, %d ticks skipped (in-flight cap);",
		s.Requests, s.Status5xx, s.Unexpected-s.Status5xx, s.Refused, s.ClientErrors, s.Undecided, s.Identity, s.Skipped)
	for _, t := range tenants {
		fmt.Fprintf(&b, " %s %v", t, s.Codes[t])
	}
	return b.String()
}

// target is one gateway in the load, with what sending to it needs.
type target struct {
	Target
	routed atomic.Bool
	flight atomic.Int64 // requests open
	client *http.Client
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Load sends flows to targets until Stop. A gateway can be taken out of rotation and
// drained (Drain) and put back (Route), as a load balancer follows readiness, and
// gateways can join (AddTarget) and leave (RemoveTarget).
type Load struct {
	rec   *Recorder
	flows []Flow
	began time.Time
	ctx   context.Context
	stop  context.CancelFunc

	mu      sync.Mutex
	targets map[string]*target
}

// StartLoad starts sending each flow to each of its gateways at its rate, for at most
// limit.
func StartLoad(ctx context.Context, rec *Recorder, targets []Target, flows []Flow, limit time.Duration) (*Load, error) {
	for _, f := range flows {
		if f.Rate <= 0 {
			return nil, fmt.Errorf("flow %s: rate %v must be > 0", f.Tenant, f.Rate)
		}
		if f.Door == DoorRLS {
			for _, s := range f.Spellings {
				if s.Route == "" {
					return nil, fmt.Errorf("flow %s: an RLS spelling without a route entry", f.Tenant)
				}
			}
		}
	}
	l := &Load{rec: rec, flows: flows, began: time.Now(), targets: map[string]*target{}}
	l.ctx, l.stop = context.WithTimeout(ctx, limit)
	for _, t := range targets {
		if err := l.AddTarget(t); err != nil {
			l.Stop()
			return nil, err
		}
	}
	for _, f := range flows {
		for _, id := range f.Gateways {
			if l.target(id) == nil {
				l.Stop()
				return nil, fmt.Errorf("flow %s: no gateway %s", f.Tenant, id)
			}
		}
	}
	return l, nil
}

func (l *Load) target(id string) *target {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.targets[id]
}

// AddTarget starts the flows that go to t: those naming it, and those that go to every
// gateway with their door.
func (l *Load) AddTarget(t Target) error {
	for _, u := range []string{t.URL, t.Check, "http://" + t.RLS} {
		if u == "" || u == "http://" {
			continue
		}
		if err := loadgen.CheckLoopback(u); err != nil {
			return fmt.Errorf("target %s: %w", t.Gateway, err)
		}
	}
	tg := &target{Target: t, client: &http.Client{
		Timeout:   requestTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		// A redirect (a path the mux cleans) is an answer: the client does not follow it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	if t.RLS != "" {
		conn, err := grpc.NewClient(t.RLS, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("target %s: rls: %w", t.Gateway, err)
		}
		tg.conn, tg.rls = conn, rlsv3.NewRateLimitServiceClient(conn)
	}
	tg.routed.Store(true)
	var ctx context.Context
	ctx, tg.cancel = context.WithCancel(l.ctx)
	l.mu.Lock()
	if old := l.targets[t.Gateway]; old != nil {
		l.mu.Unlock()
		tg.cancel()
		if tg.conn != nil {
			_ = tg.conn.Close()
		}
		return fmt.Errorf("target %s added twice", t.Gateway)
	}
	l.targets[t.Gateway] = tg
	l.mu.Unlock()
	for _, f := range l.flows {
		if (len(f.Gateways) > 0 && !contains(f.Gateways, t.Gateway)) || (f.Region != "" && f.Region != t.Region) {
			continue
		}
		if (f.Door == DoorCheck && t.Check == "") || (f.Door == DoorRLS && t.RLS == "") {
			continue
		}
		tg.wg.Go(func() { l.flow(ctx, tg, f) })
	}
	return nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// RemoveTarget drains gateway id (at most limit) and stops its flows.
func (l *Load) RemoveTarget(id string, limit time.Duration) error {
	err := l.Drain(id, limit)
	l.mu.Lock()
	tg := l.targets[id]
	delete(l.targets, id)
	l.mu.Unlock()
	if tg == nil {
		return err
	}
	tg.cancel()
	tg.wg.Wait()
	l.close(tg)
	return err
}

func (l *Load) close(tg *target) {
	tg.client.CloseIdleConnections()
	if tg.conn != nil {
		_ = tg.conn.Close()
	}
}

// flow sends f to t at its rate until ctx ends.
func (l *Load) flow(ctx context.Context, t *target, f Flow) {
	if f.Start > 0 && !waitFor(ctx, l.began.Add(f.Start)) {
		return
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / f.Rate))
	defer tick.Stop()
	var open sync.WaitGroup
	defer open.Wait()
	var mine atomic.Int64
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if f.Stop > 0 && time.Since(l.began) >= f.Stop {
			return
		}
		if !t.routed.Load() {
			continue
		}
		if mine.Load() >= maxInFlight {
			l.rec.skip()
			continue
		}
		var sp *Spelling
		if n := len(f.Spellings); n > 0 {
			sp = &f.Spellings[i%n]
		}
		mine.Add(1)
		t.flight.Add(1)
		open.Go(func() {
			defer mine.Add(-1)
			defer t.flight.Add(-1)
			if f.Door == DoorRLS {
				l.sendRLS(t, f, sp)
			} else {
				l.send(t, f, sp)
			}
		})
	}
}

// send makes one HTTP request, to the proxy or to the nginx in front of the check door;
// it is not tied to the load's context, so that Stop lets every request finish (each is
// bounded by requestTimeout). Every 200 and 429 must carry X-RateLimit-Limit (a decision
// was made), and the upstream of a 200 must have seen exactly one tenant header, the
// flow's own.
func (l *Load) send(t *target, f Flow, sp *Spelling) {
	base := t.URL
	if f.Door == DoorCheck {
		base = t.Check
	}
	path := cmp.Or(f.Path, "/orders")
	if sp != nil && sp.Path != "" {
		path = sp.Path
	}
	req, err := http.NewRequest(http.MethodGet, base+"/", nil)
	if err != nil {
		l.rec.fail("%s via %s: %v", f.Tenant, t.Gateway, err)
		return
	}
	req.URL.Opaque = path // sent as written: no cleaning, no escaping, a fragment kept
	req.Header.Set("X-Api-Key", f.Key)
	if f.Hostile {
		req.Header.Set("Connection", stack.TenantHeader)
		req.Header.Set(stack.TenantHeader, Victim)
		req.Header["X-Tenant_Id"] = []string{Victim} // as sent: Set would canonicalise it
	}
	if sp != nil && sp.Value != "" {
		req.Header[stack.ValueHeader] = []string{sp.Value}
	}
	if sp != nil && sp.XFF != "" {
		req.Header["X-Forwarded-For"] = []string{sp.XFF}
	}
	sent := time.Now()
	resp, err := t.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // its URL is the placeholder; say the path instead
		}
		l.rec.fail("%s via %s %s %s at %s: %v", f.Tenant, f.Door, t.Gateway, path, sent.Format("15:04:05.000"), err)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	limit := resp.Header.Get("X-RateLimit-Limit")
	l.rec.answer(f, t.Region, t.Gateway, sp, resp.StatusCode, limit, sent, time.Now())
	if resp.StatusCode >= 500 {
		l.rec.note("%s via %s %s %s at %s: %d %.200s", f.Tenant, f.Door, t.Gateway, path, sent.Format("15:04:05.000"), resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return
	}
	if limit == "" {
		l.rec.problem("undecided", "%s via %s %s at %s: %d without X-RateLimit-Limit", f.Tenant, f.Door, t.Gateway, sent.Format("15:04:05.000"), resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		return
	}
	var e stack.Echo
	if err := json.Unmarshal(body, &e); err != nil || len(e.TenantHeaders) != 1 || e.TenantHeaders[0] != f.Tenant {
		l.rec.problem("identity", "%s via %s %s at %s (hostile %v): the upstream saw tenant headers %q (%v)", f.Tenant, f.Door, t.Gateway, sent.Format("15:04:05.000"), f.Hostile, e.TenantHeaders, err)
	}
}

// sendRLS makes one ShouldRateLimit call as Envoy would: one descriptor with the api_key
// entry, the route entry, and the spelling's value and remote_address entries. OK is an
// admission (it must carry X-RateLimit-Limit among the headers to add), OVER_LIMIT a
// 429, InvalidArgument a 400; any other gRPC error is a 500 (the caller's
// failure_mode_deny would decide, which is the gateway failing).
func (l *Load) sendRLS(t *target, f Flow, sp *Spelling) {
	route := "orders"
	if sp != nil {
		route = sp.Route
	}
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: f.Key}, {Key: "route", Value: route}}}
	if sp != nil && sp.Value != "" {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: stack.ValueHeader, Value: sp.Value})
	}
	if sp != nil && sp.XFF != "" {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "remote_address", Value: sp.XFF})
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	sent := time.Now()
	resp, err := t.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "torture", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	recv := time.Now()
	if err != nil {
		st, ok := status.FromError(err)
		switch {
		case errors.Is(err, context.DeadlineExceeded) || !ok:
			l.rec.fail("%s via rls %s at %s: %v", f.Tenant, t.Gateway, sent.Format("15:04:05.000"), err)
		case st.Code() == codes.InvalidArgument:
			l.rec.answer(f, t.Region, t.Gateway, sp, http.StatusBadRequest, "", sent, recv)
		default:
			l.rec.answer(f, t.Region, t.Gateway, sp, http.StatusInternalServerError, "", sent, recv)
			l.rec.note("%s via rls %s at %s: %v", f.Tenant, t.Gateway, sent.Format("15:04:05.000"), err)
		}
		return
	}
	limit := ""
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), "X-RateLimit-Limit") {
			limit = h.GetValue()
		}
	}
	code := http.StatusOK
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		code = http.StatusTooManyRequests
	}
	l.rec.answer(f, t.Region, t.Gateway, sp, code, limit, sent, recv)
	if code == http.StatusOK && limit == "" {
		l.rec.problem("undecided", "%s via rls %s at %s: OK without X-RateLimit-Limit", f.Tenant, t.Gateway, sent.Format("15:04:05.000"))
	}
}

// Drain takes gateway id out of rotation and waits (at most limit) until its open
// requests have been answered.
func (l *Load) Drain(id string, limit time.Duration) error {
	t := l.target(id)
	if t == nil {
		return fmt.Errorf("drain %s: not in the load", id)
	}
	t.routed.Store(false)
	deadline := time.Now().Add(limit)
	for t.flight.Load() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("drain %s: %d requests still open after %v", id, t.flight.Load(), limit)
		}
		time.Sleep(10 * time.Millisecond) // polling a counter: the requests end on their own
	}
	t.client.CloseIdleConnections()
	return nil
}

// Route puts gateway id back into rotation.
func (l *Load) Route(id string) {
	if t := l.target(id); t != nil {
		t.client.CloseIdleConnections()
		t.routed.Store(true)
	}
}

// Stop stops sending and waits until every open request has been answered.
func (l *Load) Stop() {
	l.stop()
	l.mu.Lock()
	ts := make([]*target, 0, len(l.targets))
	for _, t := range l.targets {
		ts = append(ts, t)
	}
	l.mu.Unlock()
	for _, t := range ts {
		t.wg.Wait()
		l.close(t)
	}
}
