package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Status classes, the code_class label.
var codeClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// codeClass is the index into codeClasses of an HTTP status; anything outside 100..599
// (only a broken upstream sends one) counts as 5xx.
func codeClass(code int) int {
	if code < 100 || code >= 600 {
		return 4
	}
	return code/100 - 1
}

// Reasons of ratelimit_upstream_errors_total.
const (
	upReasonTimeout = "timeout"
	upReasonConnect = "connect"
	upReasonTLS     = "tls"
	upReasonReset   = "reset"
	upReasonOther   = "other"
)

var upstreamReasons = []string{upReasonTimeout, upReasonConnect, upReasonTLS, upReasonReset, upReasonOther}

// upstreamReason sorts a transport error into a bounded reason.
func upstreamReason(err error) string {
	var ne net.Error
	var op *net.OpError
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	var hn x509.HostnameError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return upReasonTimeout
	case errors.As(err, &cv), errors.As(err, &rh), errors.As(err, &ua), errors.As(err, &ci), errors.As(err, &hn):
		return upReasonTLS
	case errors.As(err, &op) && op.Op == "dial":
		return upReasonConnect
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return upReasonReset
	}
	return upReasonOther
}

// observer holds the proxy's request, upstream and error series, the rate-limited
// upstream error log and the access log.
type observer struct {
	region  string
	log     *slog.Logger
	now     func() time.Time
	access  AccessLogConfig
	trusted trustedProxies

	byPattern map[string]string // ServeMux pattern -> route id
	request   map[string]*[len(codeClasses)]prometheus.Observer
	upstream  map[string]*[len(codeClasses)]prometheus.Observer
	errs      map[string]map[string]prometheus.Counter // route -> reason

	errLog errLogLimiter
}

// Durations of a proxied request span a local refusal (~100µs) to a slow upstream.
var proxyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// newObserver registers the proxy's series, every (route, class) pre-initialised. Route
// labels are the configured route ids and routeUnmatched: bounded by the file.
func newObserver(reg prometheus.Registerer, m *metrics, cfg *Config, log *slog.Logger, now func() time.Time, trusted trustedProxies) (*observer, error) {
	r := prometheus.Labels{"region": cfg.Region}
	reqVec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "ratelimit_gateway_request_duration_seconds",
		Help:        "Time from a request's arrival to the end of its response, by route (route ids, or \"" + routeUnmatched + "\") and status class (1xx..5xx): refusals and proxied requests alike.",
		Buckets:     proxyBuckets,
		ConstLabels: r,
	}, []string{"route", "code_class"})
	upVec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "ratelimit_upstream_duration_seconds",
		Help:        "Time from forwarding a request to the upstream's response headers, by route and the upstream's status class (1xx..5xx); failures are in ratelimit_upstream_errors_total instead.",
		Buckets:     proxyBuckets,
		ConstLabels: r,
	}, []string{"route", "code_class"})
	for _, c := range []prometheus.Collector{reqVec, upVec} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	o := &observer{
		region: cfg.Region, log: log, now: now, access: cfg.Observability.AccessLog, trusted: trusted,
		byPattern: make(map[string]string, len(cfg.Routes)),
		request:   make(map[string]*[len(codeClasses)]prometheus.Observer, len(cfg.Routes)+1),
		upstream:  make(map[string]*[len(codeClasses)]prometheus.Observer, len(cfg.Routes)),
		errs:      make(map[string]map[string]prometheus.Counter, len(cfg.Routes)),
	}
	resolve := func(v *prometheus.HistogramVec, route string) *[len(codeClasses)]prometheus.Observer {
		var a [len(codeClasses)]prometheus.Observer
		for i, c := range codeClasses {
			a[i] = v.WithLabelValues(route, c)
		}
		return &a
	}
	for _, rc := range cfg.Routes {
		o.byPattern[rc.Match] = rc.ID
		o.request[rc.ID] = resolve(reqVec, rc.ID)
		o.upstream[rc.ID] = resolve(upVec, rc.ID)
		o.errs[rc.ID] = make(map[string]prometheus.Counter, len(upstreamReasons))
		for _, reason := range upstreamReasons {
			o.errs[rc.ID][reason] = m.upstreamErrors.WithLabelValues(rc.ID, reason)
		}
	}
	o.request[routeUnmatched] = resolve(reqVec, routeUnmatched)
	return o, nil
}

// routeOf is the route id of a request the mux has served (it sets r.Pattern).
func (o *observer) routeOf(r *http.Request) string {
	if id, ok := o.byPattern[r.Pattern]; ok {
		return id
	}
	return routeUnmatched
}

// wrap is h with every request's duration by route and status class, and the sampled
// access log. It is the gateway's outermost handler.
func (o *observer) wrap(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		logged := o.access.Enabled && (o.access.SampleRatio >= 1 || rand.Float64() < o.access.SampleRatio)
		var info *accessInfo
		if logged {
			info = &accessInfo{}
			r = r.WithContext(context.WithValue(r.Context(), accessInfoKey{}, info))
		}
		sw := statusWriters.Get().(*statusWriter)
		sw.ResponseWriter, sw.code, sw.bytes = w, 0, 0
		mux.ServeHTTP(sw, r)
		elapsed := time.Since(start)
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		route := o.routeOf(r)
		o.request[route][codeClass(code)].Observe(elapsed.Seconds())
		if logged {
			o.accessLog(r, info, route, code, sw.bytes, elapsed)
		}
		sw.ResponseWriter = nil
		statusWriters.Put(sw)
	})
}

// accessInfo is what the handler tells the access log of a request it forwarded: the
// tenant it authenticated (never what the client claimed in a header).
type accessInfo struct{ tenant string }

// accessInfoKey is the context key of a logged request's *accessInfo.
type accessInfoKey struct{}

// noteForwarded records, for the access log if this request is logged, the tenant it
// was forwarded for.
func noteForwarded(r *http.Request, tenant string) {
	if info, ok := r.Context().Value(accessInfoKey{}).(*accessInfo); ok {
		info.tenant = tenant
	}
}

// accessLog writes one access line. The fields are a fixed set: no header (the key
// travels in one), no query string (keys are sometimes put there by mistake).
func (o *observer) accessLog(r *http.Request, info *accessInfo, route string, code int, bytes int64, elapsed time.Duration) {
	attrs := []slog.Attr{
		slog.String("region", o.region),
		slog.String("route", route),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", code),
		slog.Int64("bytes", bytes),
		slog.Float64("duration_seconds", elapsed.Seconds()),
		slog.String("client", o.trusted.clientAddr(r).String()),
	}
	if info.tenant != "" {
		attrs = append(attrs, slog.String("tenant", info.tenant))
	}
	o.log.LogAttrs(r.Context(), slog.LevelInfo, "access", attrs...)
}

// statusWriter records the status and the body bytes of a response. Unwrap lets
// http.ResponseController (which ReverseProxy uses to flush and to hijack for upgrades)
// reach the connection's writer.
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

var statusWriters = sync.Pool{New: func() any { return new(statusWriter) }}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code // the final status, not a 1xx informational one
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// transport is base with each round trip's time to the response headers observed by
// route and status class.
func (o *observer) transport(route string, base http.RoundTripper) http.RoundTripper {
	return &timedTransport{base: base, obs: o.upstream[route]}
}

type timedTransport struct {
	base http.RoundTripper
	obs  *[len(codeClasses)]prometheus.Observer
}

func (t *timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	res, err := t.base.RoundTrip(req)
	if err == nil {
		t.obs[codeClass(res.StatusCode)].Observe(time.Since(start).Seconds())
	}
	return res, err
}

// upstreamFailed counts a request answered 502 because its upstream failed (the client
// still waiting) by reason, and logs it at WARN, at most one line a second with the
// number of failures not logged since the last line.
func (o *observer) upstreamFailed(r *http.Request, route string, err error) {
	if r.Context().Err() != nil {
		return // the client went away: not the upstream's failure
	}
	reason := upstreamReason(err)
	o.errs[route][reason].Inc()
	if suppressed, ok := o.errLog.allow(o.now()); ok {
		o.log.Warn("upstream failed", "region", o.region, "route", route, "reason", reason,
			"err", err, "suppressed", suppressed)
	}
}

// errLogInterval is the least time between two upstream error lines.
const errLogInterval = time.Second

// errLogLimiter lets one line through per errLogInterval and counts the rest.
type errLogLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int64
}

// allow reports whether a line may be written now, and how many were suppressed since
// the last one.
func (l *errLogLimiter) allow(now time.Time) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < errLogInterval {
		l.suppressed++
		return 0, false
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return n, true
}
