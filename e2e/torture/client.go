package torture

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
)

// Target is a gateway the load is sent to.
type Target struct{ Gateway, Region, URL string }

// Flow is one tenant's load on every gateway it is sent to.
type Flow struct {
	Tenant, Key string
	// Rate is the requests per second sent to each gateway.
	Rate float64
	// Gateways limits the flow to these gateway ids (all when empty).
	Gateways []string
	// Path is the request path (default /orders); Cost the tokens one request of it
	// takes (default 1), what an admission counts for.
	Path string
	Cost int
	// Hostile requests try to strip or double the tenant header the gateway sets for the
	// upstream (issue 14 item 7): "Connection: X-Tenant-Id" (a hop-by-hop header list
	// that a reverse proxy strips), "X-Tenant-Id: victim" and "X-Tenant_Id: victim".
	Hostile bool
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

// Recorder counts every answer: the admitted requests with their send and receive time
// per tenant and region, the status codes per tenant, and every client-side error. It is
// safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	admitted map[string]map[string][]Admission
	// throttled are the send times of each tenant's 429s.
	throttled map[string][]time.Time
	codes     map[string]map[int]int
	errs      []string
	nErrs     int
	skipped   int
	// undecided are answers without X-RateLimit-Limit (the gateway failed open), and
	// identity answers whose upstream saw another tenant header than the flow's own.
	undecided, identity int
	problems            []string
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{admitted: map[string]map[string][]Admission{}, throttled: map[string][]time.Time{}, codes: map[string]map[int]int{}}
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

func (r *Recorder) answer(tenant, region string, code, cost int, sent, recv time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
		r.admitted[tenant][region] = append(r.admitted[tenant][region], Admission{Sent: sent, Recv: recv, Cost: cost})
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

// Summary is what the recorder saw.
type Summary struct {
	Codes map[string]map[int]int // tenant -> status -> count
	// Requests, Status5xx and Unexpected (a status other than 200 and 429) over all
	// tenants; ClientErrors are requests without an answer (transport error, timeout).
	Requests, Status5xx, Unexpected, ClientErrors, Skipped int
	Errors                                                 []string
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
		Undecided: r.undecided, Identity: r.identity, Problems: append([]string(nil), r.problems...)}
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
	fmt.Fprintf(&b, "%d requests, %d 5xx, %d other unexpected, %d client errors, %d undecided, %d tenant header breaches, %d ticks skipped (in-flight cap);",
		s.Requests, s.Status5xx, s.Unexpected-s.Status5xx, s.ClientErrors, s.Undecided, s.Identity, s.Skipped)
	for _, t := range tenants {
		fmt.Fprintf(&b, " %s %v", t, s.Codes[t])
	}
	return b.String()
}

// Load sends flows to targets until Stop. A gateway can be taken out of rotation and
// drained (Drain) and put back (Route), as a load balancer follows readiness.
type Load struct {
	rec     *Recorder
	targets map[string]Target
	routed  map[string]*atomic.Bool
	flight  map[string]*atomic.Int64 // gateway -> requests open
	clients map[string]*http.Client
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// StartLoad starts sending each flow to each of its gateways at its rate, for at most
// limit.
func StartLoad(ctx context.Context, rec *Recorder, targets []Target, flows []Flow, limit time.Duration) (*Load, error) {
	l := &Load{rec: rec, targets: map[string]Target{}, routed: map[string]*atomic.Bool{}, flight: map[string]*atomic.Int64{}, clients: map[string]*http.Client{}}
	for _, t := range targets {
		if err := loadgen.CheckLoopback(t.URL); err != nil {
			return nil, fmt.Errorf("target %s: %w", t.Gateway, err)
		}
		l.targets[t.Gateway] = t
		l.routed[t.Gateway] = &atomic.Bool{}
		l.routed[t.Gateway].Store(true)
		l.flight[t.Gateway] = &atomic.Int64{}
		l.clients[t.Gateway] = &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}
	}
	ctx, l.cancel = context.WithTimeout(ctx, limit)
	for _, f := range flows {
		if f.Rate <= 0 {
			return nil, fmt.Errorf("flow %s: rate %v must be > 0", f.Tenant, f.Rate)
		}
		gws := f.Gateways
		if len(gws) == 0 {
			for _, t := range targets {
				gws = append(gws, t.Gateway)
			}
		}
		for _, id := range gws {
			t, ok := l.targets[id]
			if !ok {
				l.cancel()
				return nil, fmt.Errorf("flow %s: no gateway %s", f.Tenant, id)
			}
			l.wg.Go(func() { l.flow(ctx, t, f) })
		}
	}
	return l, nil
}

// flow sends f to t at its rate until ctx ends.
func (l *Load) flow(ctx context.Context, t Target, f Flow) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / f.Rate))
	defer tick.Stop()
	var open sync.WaitGroup
	defer open.Wait()
	var mine atomic.Int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !l.routed[t.Gateway].Load() {
			continue
		}
		if mine.Load() >= maxInFlight {
			l.rec.skip()
			continue
		}
		mine.Add(1)
		l.flight[t.Gateway].Add(1)
		open.Go(func() {
			defer mine.Add(-1)
			defer l.flight[t.Gateway].Add(-1)
			l.send(t, f)
		})
	}
}

// send makes one request; it is not tied to the load's context, so that Stop lets every
// request finish (each is bounded by requestTimeout). Every 200 and 429 must carry
// X-RateLimit-Limit (a decision was made), and the upstream of a 200 must have seen
// exactly one tenant header, the flow's own.
func (l *Load) send(t Target, f Flow) {
	path, cost := cmp.Or(f.Path, "/orders"), cmp.Or(f.Cost, 1)
	req, err := http.NewRequest(http.MethodGet, t.URL+path, nil)
	if err != nil {
		l.rec.fail("%s via %s: %v", f.Tenant, t.Gateway, err)
		return
	}
	req.Header.Set("X-Api-Key", f.Key)
	if f.Hostile {
		req.Header.Set("Connection", stack.TenantHeader)
		req.Header.Set(stack.TenantHeader, Victim)
		req.Header["X-Tenant_Id"] = []string{Victim} // as sent: Set would canonicalise it
	}
	sent := time.Now()
	resp, err := l.clients[t.Gateway].Do(req)
	if err != nil {
		l.rec.fail("%s via %s at %s: %v", f.Tenant, t.Gateway, sent.Format("15:04:05.000"), err)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	l.rec.answer(f.Tenant, t.Region, resp.StatusCode, cost, sent, time.Now())
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return
	}
	if resp.Header.Get("X-RateLimit-Limit") == "" {
		l.rec.problem("undecided", "%s via %s at %s: %d without X-RateLimit-Limit", f.Tenant, t.Gateway, sent.Format("15:04:05.000"), resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		return
	}
	var e stack.Echo
	if err := json.Unmarshal(body, &e); err != nil || len(e.TenantHeaders) != 1 || e.TenantHeaders[0] != f.Tenant {
		l.rec.problem("identity", "%s via %s at %s (hostile %v): the upstream saw tenant headers %q (%v)", f.Tenant, t.Gateway, sent.Format("15:04:05.000"), f.Hostile, e.TenantHeaders, err)
	}
}

// Drain takes gateway id out of rotation and waits (at most limit) until its open
// requests have been answered.
func (l *Load) Drain(id string, limit time.Duration) error {
	l.routed[id].Store(false)
	deadline := time.Now().Add(limit)
	for l.flight[id].Load() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("drain %s: %d requests still open after %v", id, l.flight[id].Load(), limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.clients[id].CloseIdleConnections()
	return nil
}

// Route puts gateway id back into rotation.
func (l *Load) Route(id string) {
	l.clients[id].CloseIdleConnections()
	l.routed[id].Store(true)
}

// Stop stops sending and waits until every open request has been answered.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
	for _, c := range l.clients {
		c.CloseIdleConnections()
	}
}
