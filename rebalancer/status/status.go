package status

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Defaults filled in by New.
const (
	DefaultRateWindow   = time.Minute
	DefaultChartRange   = time.Hour
	DefaultTopScopes    = 10
	DefaultHistoryLimit = 20
	DefaultTimeout      = 5 * time.Second
	// chartPoints is the number of steps of a chart's range query.
	chartPoints = 120
)

// ErrStoreUnavailable is wrapped by Collect when PostgreSQL could not be read; the page
// answers 503 then.
var ErrStoreUnavailable = errors.New("postgresql unavailable")

// Store is what the page reads from PostgreSQL (store.Store). These are small reads:
// the page does not load the API keys that a full snapshot holds.
type Store interface {
	Regions(ctx context.Context) ([]string, error)
	Instances(ctx context.Context) ([]regions.Instance, error)
	// RegionsLastSeen decides a dark region as the rebalancer does (store.RegionDark).
	RegionsLastSeen(ctx context.Context) (map[string]time.Time, error)
	Shares(ctx context.Context) ([]regions.Share, error)
	History(ctx context.Context, f store.HistoryFilter) ([]store.HistoryEntry, error)
	// TopUsage is the calendar-quota periods with the most usage (store.Store.TopUsage).
	TopUsage(ctx context.Context, since time.Time, n int) ([]store.QuotaPeriod, error)
}

// Prometheus is the part of the Prometheus HTTP API the page queries (promv1.API).
type Prometheus interface {
	Query(ctx context.Context, query string, ts time.Time, opts ...promv1.Option) (model.Value, promv1.Warnings, promv1.Infos, error)
	QueryRange(ctx context.Context, query string, r promv1.Range, opts ...promv1.Option) (model.Value, promv1.Warnings, promv1.Infos, error)
}

// Source is one Prometheus server. Region "" means it holds the series of every region;
// otherwise only that region's series are read from it (one Prometheus per region, as the
// rebalancer's --prometheus-url region=URL).
type Source struct {
	Region string
	API    Prometheus
}

// Config configures a Handler. Zero fields take the defaults.
type Config struct {
	// Prometheus lists the servers to query; none means the page shows no live figures
	// and says so.
	Prometheus []Source
	// InstanceTTL: a gateway unseen for longer is not live (the rebalancer's
	// --instance-ttl); default job.DefaultInstanceTTL.
	InstanceTTL time.Duration
	// RateWindow is the rate() window of the live figures; default 1 min.
	RateWindow time.Duration
	// ChartRange is how far back the charts go; default 1 h.
	ChartRange time.Duration
	// TopScopes is the number of tenant scopes listed; default 10.
	TopScopes int
	// HistoryLimit is the number of share changes listed; default 20.
	HistoryLimit int
	// Timeout bounds each request's reads from PostgreSQL and, separately, Prometheus.
	Timeout time.Duration
	// LastRun, when set, reports the rebalancer's last tick ((*job.Job).Last).
	LastRun func() job.Report
	// StaleAfter: with LastRun set, a last tick older than this (or none, once the page
	// has been up that long) shows the badge "stale" ((*job.Job).StaleAfter); default
	// job.DefaultStaleAfter.
	StaleAfter time.Duration
	// Now is the clock; nil means time.Now. Gateway liveness compares it with the
	// heartbeats' database time.
	Now    func() time.Time
	Logger *slog.Logger
}

// Handler serves the status page at "/", its data at "/status.json" and the embedded
// assets under "/assets/". It is safe for concurrent use.
type Handler struct {
	cfg   Config
	store Store
	// started is when New ran: without any tick for StaleAfter since, the page is stale.
	started time.Time
	log     *slog.Logger
	mux     *http.ServeMux
	page    *template.Template
	down    *template.Template
	// Failing states, so a failure is logged when it starts and ends, not on every view.
	promFailing  atomic.Bool
	storeFailing atomic.Bool
}

//go:embed templates static
var assets embed.FS

// New validates cfg, fills defaults and parses the embedded templates. It dials nothing.
func New(cfg Config, store Store) (*Handler, error) {
	if store == nil {
		return nil, errors.New("status: a store is required")
	}
	for i, s := range cfg.Prometheus {
		if s.API == nil {
			return nil, fmt.Errorf("status: prometheus source %d has no API", i)
		}
		if s.Region != "" {
			if err := regions.ValidateID("region", s.Region); err != nil {
				return nil, fmt.Errorf("status: prometheus source %d: %w", i, err)
			}
		}
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.InstanceTTL, job.DefaultInstanceTTL)
	def(&cfg.StaleAfter, job.DefaultStaleAfter)
	def(&cfg.RateWindow, DefaultRateWindow)
	def(&cfg.ChartRange, DefaultChartRange)
	def(&cfg.Timeout, DefaultTimeout)
	if cfg.TopScopes == 0 {
		cfg.TopScopes = DefaultTopScopes
	}
	if cfg.HistoryLimit == 0 {
		cfg.HistoryLimit = DefaultHistoryLimit
	}
	switch {
	case cfg.InstanceTTL < 0 || cfg.Timeout < 0 || cfg.StaleAfter < 0:
		return nil, errors.New("status: InstanceTTL, Timeout and StaleAfter must be > 0")
	case cfg.RateWindow < time.Second:
		return nil, fmt.Errorf("status: RateWindow %s: must be at least 1s", cfg.RateWindow)
	case cfg.ChartRange < time.Minute:
		return nil, fmt.Errorf("status: ChartRange %s: must be at least 1m", cfg.ChartRange)
	case cfg.TopScopes < 0 || cfg.HistoryLimit < 0:
		return nil, errors.New("status: TopScopes and HistoryLimit must be >= 0")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &Handler{cfg: cfg, store: store, log: cfg.Logger, started: cfg.Now()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if h.page, err = parse("templates/page.html.tmpl"); err != nil {
		return nil, err
	}
	if h.down, err = parse("templates/unavailable.html.tmpl"); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("status: assets: %w", err)
	}
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /{$}", h.servePage)
	h.mux.HandleFunc("GET /status.json", h.serveJSON)
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", assetServer(static)))
	return h, nil
}

func parse(name string) (*template.Template, error) {
	t, err := template.New("").Funcs(funcs).ParseFS(assets, name, "templates/layout.html.tmpl")
	if err != nil {
		return nil, fmt.Errorf("status: template %s: %w", name, err)
	}
	return t, nil
}

// ServeHTTP routes "/", "/status.json" and "/assets/"; anything else is a 404.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// securityHeaders allow only the page's own assets: no inline script, no third party.
func securityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
}

func assetServer(static fs.FS) http.Handler {
	files := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})
}

func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	st, err := h.Collect(r.Context())
	if err != nil {
		h.unavailable(w, err, func(code int, msg string) {
			h.render(w, code, h.down, map[string]any{"Title": "Status unavailable", "Message": msg, "At": h.cfg.Now().UTC()})
		})
		return
	}
	h.render(w, http.StatusOK, h.page, pageData(st, h.cfg))
}

func (h *Handler) serveJSON(w http.ResponseWriter, r *http.Request) {
	writeJSON := func(code int, v any) {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			h.log.Error("status json failed", "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		securityHeaders(w)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write(append(b, '\n'))
	}
	st, err := h.Collect(r.Context())
	if err != nil {
		h.unavailable(w, err, func(code int, msg string) {
			writeJSON(code, map[string]any{"error": msg, "generated_at": h.cfg.Now().UTC()})
		})
		return
	}
	writeJSON(http.StatusOK, st)
}

// unavailable answers a failed Collect with a fixed message: 503 when PostgreSQL could not
// be read, else 500. The error itself is logged, never shown.
func (h *Handler) unavailable(w http.ResponseWriter, err error, answer func(code int, msg string)) {
	if errors.Is(err, ErrStoreUnavailable) {
		answer(http.StatusServiceUnavailable,
			"PostgreSQL unreachable: the regions, shares and share history cannot be read. "+
				"The gateways keep enforcing their last loaded shares and the rebalancer skips its runs until the database is back.")
		return
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	h.log.Error("status page failed", "err", err)
	answer(http.StatusInternalServerError, "The status could not be assembled; see the rebalancer's log.")
}

// render executes t into a buffer first, so a template error is a clean 500.
func (h *Handler) render(w http.ResponseWriter, code int, t *template.Template, data any) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", data); err != nil {
		h.log.Error("status template failed", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	securityHeaders(w)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = io.Copy(w, &buf)
}
