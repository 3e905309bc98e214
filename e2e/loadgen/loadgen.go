package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// MaxDuration bounds every run.
const MaxDuration = 30 * time.Minute

// ErrNotLoopback is returned for a target outside 127.0.0.0/8 and ::1.
var ErrNotLoopback = errors.New("load targets must be loopback addresses")

// Stream is one flow of requests: one URL, one set of headers, one rate.
type Stream struct {
	// Name labels the stream in results, e.g. "us-east/shop-a".
	Name   string
	Method string // default GET
	URL    string // must be on a loopback address
	Header http.Header
	// Rate is the request rate at a point of the run, in requests per second. It is read
	// about every 100 ms, so a step change takes effect within that. At 0 (or below) the
	// stream sends nothing.
	Rate func(elapsed time.Duration) float64
}

// Constant is a Rate that does not change.
func Constant(rps float64) func(time.Duration) float64 {
	return func(time.Duration) float64 { return rps }
}

// Steps is a Rate that is first[0] until at[0], then first[1] until at[1], and so on.
func Steps(at []time.Duration, rates []float64) func(time.Duration) float64 {
	return func(e time.Duration) float64 {
		for i, t := range at {
			if e < t {
				return rates[i]
			}
		}
		return rates[len(rates)-1]
	}
}

// Result is what one stream saw.
type Result struct {
	Name     string
	Requests uint64
	Codes    map[int]uint64 // HTTP status -> count; 0 = transport error
	P50, P99 time.Duration
	P999     time.Duration
	Max      time.Duration
}

// Counts is a live view of a run, safe to read while it runs.
type Counts struct {
	mu     sync.Mutex
	codes  map[string]map[int]uint64
	latest map[string][]time.Duration
}

// Snapshot copies the status counts per stream so far.
func (c *Counts) Snapshot() map[string]map[int]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]map[int]uint64, len(c.codes))
	for n, m := range c.codes {
		cp := make(map[int]uint64, len(m))
		for k, v := range m {
			cp[k] = v
		}
		out[n] = cp
	}
	return out
}

func (c *Counts) add(name string, code int, lat time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.codes == nil {
		c.codes = map[string]map[int]uint64{}
		c.latest = map[string][]time.Duration{}
	}
	m := c.codes[name]
	if m == nil {
		m = map[int]uint64{}
		c.codes[name] = m
	}
	m[code]++
	c.latest[name] = append(c.latest[name], lat)
}

// Run sends every stream's load for d (at most MaxDuration) or until ctx ends, and
// returns per-stream results (none for a stream that sent nothing, its rate 0 throughout).
// live, if not nil, is updated as responses arrive.
func Run(ctx context.Context, streams []Stream, d time.Duration, live *Counts) ([]Result, error) {
	if d <= 0 || d > MaxDuration {
		return nil, fmt.Errorf("load duration %v must be in (0, %v]", d, MaxDuration)
	}
	for _, s := range streams {
		if err := CheckLoopback(s.URL); err != nil {
			return nil, fmt.Errorf("stream %s: %w", s.Name, err)
		}
		if s.Rate == nil {
			return nil, fmt.Errorf("stream %s: no rate", s.Name)
		}
	}
	if live == nil {
		live = &Counts{}
	}
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			attack(ctx, s, d, live)
		}()
	}
	wg.Wait()
	return results(live), nil
}

func attack(ctx context.Context, s Stream, d time.Duration, live *Counts) {
	method := s.Method
	if method == "" {
		method = http.MethodGet
	}
	target := vegeta.Target{Method: method, URL: s.URL, Header: s.Header}
	a := vegeta.NewAttacker(vegeta.Timeout(5*time.Second), vegeta.KeepAlive(true), vegeta.Redirects(vegeta.NoFollow), vegeta.MaxWorkers(256))
	ch := a.Attack(vegeta.NewStaticTargeter(target), &pacer{rate: s.Rate, end: d}, d, s.Name)
	for {
		select {
		case <-ctx.Done():
			a.Stop()
			for range ch {
			}
			return
		case r, ok := <-ch:
			if !ok {
				return
			}
			live.add(s.Name, int(r.Code), r.Latency)
		}
	}
}

// pacer turns a rate function into vegeta's Pacer: the wait before the next hit given
// how many hits have gone out. Hit n is due when the rate, integrated in 100 ms steps from
// the start, reaches n; the sum up to the step holding elapsed is remembered, since
// elapsed only grows.
type pacer struct {
	rate func(time.Duration) float64
	end  time.Duration // the attack's duration: no hit is due after it
	mu   sync.Mutex
	t    time.Duration // integrated up to here
	sum  float64       // hits due by t
}

const paceStep = 100 * time.Millisecond

// Pace returns the wait until hit hits+1 is due. vegeta (v12 lib/attack.go) sleeps that
// long and then sends the hit without asking again, so the wait reaches across any stretch
// at rate 0 (or below) to the moment the hit is due. When none is due by the end of the
// attack, it stops the attack: a wait past the end would still send one hit.
func (p *pacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.t+paceStep <= elapsed {
		p.sum += p.rateAt(p.t) * paceStep.Seconds()
		p.t += paceStep
	}
	want := float64(hits) + 1
	// Look ahead step by step, from the one holding elapsed, for where the sum reaches want.
	for t, sum := p.t, p.sum; t <= p.end; t += paceStep {
		r := p.rateAt(t)
		if from := max(elapsed, t); sum+r*(from-t).Seconds() >= want {
			return from - elapsed, false // due already (behind schedule)
		}
		if dt := (want - sum) / r; dt < paceStep.Seconds() { // r > 0 here, or dt is +Inf
			at := t + time.Duration(dt*float64(time.Second))
			return max(at-elapsed, 0), at > p.end
		}
		sum += r * paceStep.Seconds()
	}
	return 0, true
}

// rateAt is the rate at t; a negative or NaN rate sends nothing.
func (p *pacer) rateAt(t time.Duration) float64 {
	if r := p.rate(t); r > 0 {
		return r
	}
	return 0
}

func (p *pacer) Rate(elapsed time.Duration) float64 { return p.rate(elapsed) }

func results(c *Counts) []Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Result, 0, len(c.codes))
	for name, codes := range c.codes {
		r := Result{Name: name, Codes: map[int]uint64{}}
		for k, v := range codes {
			r.Codes[k] = v
			r.Requests += v
		}
		lat := append([]time.Duration(nil), c.latest[name]...)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		r.P50, r.P99, r.P999 = quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999)
		if len(lat) > 0 {
			r.Max = lat[len(lat)-1]
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

// CheckLoopback accepts only URLs whose host is a loopback IP or "localhost".
func CheckLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("target %q: %w", raw, err)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("target %q: %w", raw, ErrNotLoopback)
	}
	return nil
}
