package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/quotaplane/quotaplane/regions"
)

// ReloaderOptions configures a Reloader. Only Load is required.
type ReloaderOptions struct {
	// Load reads and validates a whole new snapshot, e.g. a Store's LoadSnapshot.
	Load func(ctx context.Context) (*regions.Snapshot, error)
	// ListenURL is the database to LISTEN on for NotifyChannel, on a connection of its own.
	// Empty: no LISTEN, the timer alone reloads.
	ListenURL string
	// Interval is the safety-net reload period. Default 30 s.
	Interval time.Duration
	// Debounce coalesces a burst of notifications into one reload. Default 100 ms.
	Debounce time.Duration
	// LoadTimeout bounds one Load. Default 10 s.
	LoadTimeout time.Duration
	// Logger receives state changes (nil: discard). Never logs data.
	Logger *slog.Logger
	// OnReload, if set, is called with every new snapshot after it is swapped in (metrics).
	OnReload func(*regions.Snapshot)
	// OnError, if set, is called with every failed load (metrics); the previous snapshot
	// stays current.
	OnError func(error)
	// Registerer receives the reloader's metrics (nil: not registered):
	// ratelimit_snapshot_rows_skipped_total{table} counts the rows loads left out
	// (Snapshot.Skipped), once per load that skipped them, so a bad row shows as a
	// steady rate; ratelimit_snapshot_rows_skipped{table} is the current snapshot's count.
	Registerer prometheus.Registerer
}

// Reload timing that is not configurable.
const (
	retryMin       = 500 * time.Millisecond // first retry after a failed load
	listenBackoff  = 100 * time.Millisecond // first LISTEN reconnect delay
	listenMaxDelay = 5 * time.Second        // longest LISTEN reconnect delay
	listenPing     = 15 * time.Second       // idle LISTEN connections are pinged this often
	connectTimeout = 5 * time.Second        // one LISTEN connection attempt
	// expiryMargin: the reload at an override's expiry comes this long after it, so
	// the database's now() has passed it.
	expiryMargin = 5 * time.Millisecond
)

// Reloader holds the current Snapshot and replaces it whole: on every notification on
// NotifyChannel (coalesced by Debounce), every Interval, when an override in the
// snapshot changes state (Snapshot.NextExpiry, timed as a duration from the load on the
// store's clock; when that reload fails, the expiry is applied to the snapshot held,
// Snapshot.At, so a holder cut off from the store ends an override when the others do),
// and soon after a failed load (retrying with backoff up to Interval). A load is validated before the swap; a failed
// load keeps the previous snapshot. While the LISTEN connection is down it reconnects with
// backoff and the timer keeps reloading; after it reconnects it reloads, since changes
// may have been missed.
type Reloader struct {
	opts   ReloaderOptions
	log    *slog.Logger
	cur    atomic.Pointer[regions.Snapshot]
	kick   chan struct{} // a notification arrived (buffered 1: bursts fold)
	loadMu sync.Mutex    // one load at a time, so an older load never overwrites a newer one
	failed bool          // guarded by loadMu: the last load failed (log state changes only)
	// skippedKey is the last load's skipped rows (guarded by loadMu), so they are logged
	// when they change, not on every reload.
	skippedKey string
	m          reloaderMetrics
	active     atomic.Bool // Run is running
}

// NewReloader fills defaults; it starts nothing and connects to nothing.
func NewReloader(o ReloaderOptions) *Reloader {
	if o.Interval <= 0 {
		o.Interval = 30 * time.Second
	}
	if o.Debounce <= 0 {
		o.Debounce = 100 * time.Millisecond
	}
	if o.LoadTimeout <= 0 {
		o.LoadTimeout = 10 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Reloader{opts: o, log: log, kick: make(chan struct{}, 1), m: newReloaderMetrics(o.Registerer)}
}

type reloaderMetrics struct {
	skippedTotal *prometheus.CounterVec
	skipped      *prometheus.GaugeVec
	// localExpiries counts snapshots derived without the store (expireLocally).
	localExpiries prometheus.Counter
}

// newReloaderMetrics registers on reg when it is not nil; a collector already registered
// (a second Reloader on one registry) is reused.
func newReloaderMetrics(reg prometheus.Registerer) reloaderMetrics {
	m := reloaderMetrics{
		skippedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_snapshot_rows_skipped_total",
			Help: "Rows snapshot loads left out because they are invalid, by table, counted at every load.",
		}, []string{"table"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_snapshot_rows_skipped",
			Help: "Rows the current snapshot left out because they are invalid, by table.",
		}, []string{"table"}),
		localExpiries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_snapshot_local_expiries_total",
			Help: "Share expiries applied on this process's clock because the store could not be reached at the expiry.",
		}),
	}
	for _, t := range SkippedTables {
		m.skippedTotal.WithLabelValues(t)
		m.skipped.WithLabelValues(t)
	}
	if reg != nil {
		m.skippedTotal = registerOrExisting(reg, m.skippedTotal)
		m.skipped = registerOrExisting(reg, m.skipped)
		m.localExpiries = registerOrExisting(reg, m.localExpiries)
	}
	return m
}

func registerOrExisting[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}

// SkippedRows is ratelimit_snapshot_rows_skipped_total for table (tests, status pages).
func (r *Reloader) SkippedRows(table string) float64 {
	var m dto.Metric
	if err := r.m.skippedTotal.WithLabelValues(table).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// noteSkipped counts and (when they changed) logs the rows s left out.
func (r *Reloader) noteSkipped(s *regions.Snapshot) {
	rows := s.Skipped()
	per := make(map[string]int, len(SkippedTables))
	var key strings.Builder
	for _, row := range rows {
		per[row.Table]++
		key.WriteString(row.Table + "\x00" + row.ID + "\x00")
	}
	for _, t := range SkippedTables {
		r.m.skippedTotal.WithLabelValues(t).Add(float64(per[t]))
		r.m.skipped.WithLabelValues(t).Set(float64(per[t]))
	}
	if key.String() == r.skippedKey {
		return
	}
	r.skippedKey = key.String()
	for _, row := range rows {
		r.log.Warn("config row skipped: invalid; delete or fix it", "table", row.Table, "id", row.ID, "err", row.Err)
	}
}

// Current is the last good snapshot; nil until the first load (or SetStatic) succeeds.
// It is safe for concurrent use and cheap: call it once per request.
func (r *Reloader) Current() *regions.Snapshot { return r.cur.Load() }

// SetStatic makes s the current snapshot, for a standalone gateway whose configuration
// comes from a file (it need not call Run), or for tests.
func (r *Reloader) SetStatic(s *regions.Snapshot) { r.cur.Store(s) }

// Reload loads a new snapshot now and swaps it in; on error the previous one stays and
// the error is returned (and passed to OnError unless ctx ended).
func (r *Reloader) Reload(ctx context.Context) error {
	if r.opts.Load == nil {
		return errors.New("reload config: no Load function")
	}
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, r.opts.LoadTimeout)
	defer cancel()
	start := time.Now()
	s, err := r.opts.Load(lctx)
	if err == nil && s == nil {
		err = errors.New("load returned no snapshot")
	}
	if err != nil {
		err = fmt.Errorf("reload config: %w", err)
		if ctx.Err() != nil {
			return err // shutting down: not a failure of the store
		}
		if !r.failed {
			r.log.Warn("config reload failed; keeping previous snapshot", "err", err)
		} else {
			r.log.Debug("config reload failed again", "err", err)
		}
		r.failed = true
		if r.opts.OnError != nil {
			r.opts.OnError(err)
		}
		return err
	}
	r.noteSkipped(s)
	r.cur.Store(s)
	if r.failed {
		r.log.Info("config reload recovered", "rules", s.RuleCount())
	}
	r.failed = false
	r.log.Debug("config reloaded", "rules", s.RuleCount(), "duration", time.Since(start))
	if r.opts.OnReload != nil {
		r.opts.OnReload(s)
	}
	return nil
}

// Run loads at once, then reloads on notifications and on the timer until ctx ends. It
// returns nil when ctx ends, after its goroutines have exited; an error only if it cannot
// run at all (no Load, or already running). A failed load is not an error of Run.
func (r *Reloader) Run(ctx context.Context) error {
	if r.opts.Load == nil {
		return errors.New("config reloader: no Load function")
	}
	if !r.active.CompareAndSwap(false, true) {
		return errors.New("config reloader: already running")
	}
	defer r.active.Store(false)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // runs before wg.Wait
	if r.opts.ListenURL != "" {
		// Listen before the first load, so no change falls between the two; a LISTEN that
		// fails does not hold the first load back beyond one connection attempt.
		first := make(chan struct{})
		wg.Go(func() { r.listen(ctx, first) })
		select {
		case <-first:
		case <-ctx.Done():
			return nil
		}
	}

	ticker := time.NewTicker(r.opts.Interval)
	defer ticker.Stop()
	var (
		debounce   <-chan time.Time // pending coalesced notification
		retry      <-chan time.Time // pending retry after a failure
		expiry     <-chan time.Time // the current snapshot's next override expiry
		retryDelay = retryMin
	)
	// base is the last loaded snapshot's store time (AsOf) and when, on this process's
	// monotonic clock, its load started: base.at + time.Since(base.start) estimates the
	// store's clock, ahead of it by at most the load's latency (and this clock's drift).
	var base struct {
		at    time.Time
		start time.Time
	}
	// armExpiry times the current snapshot's next expiry state change on that estimate.
	armExpiry := func() {
		expiry = nil
		if s := r.Current(); s != nil && !s.NextExpiry().IsZero() && !base.at.IsZero() {
			wait := s.NextExpiry().Sub(base.at) - time.Since(base.start)
			expiry = time.After(max(wait, 0) + expiryMargin)
		}
	}
	reload := func() bool {
		start := time.Now()
		if err := r.Reload(ctx); err != nil {
			if ctx.Err() == nil {
				retry = time.After(retryDelay)
				retryDelay = min(2*retryDelay, r.opts.Interval)
			}
			return false
		}
		retry, retryDelay = nil, retryMin
		if s := r.Current(); s != nil {
			base.at, base.start = s.AsOf(), start
		}
		armExpiry()
		return true
	}
	reload()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			if debounce == nil {
				debounce = time.After(r.opts.Debounce)
			}
		case <-debounce:
			debounce = nil
			reload()
		case <-retry:
			retry = nil
			reload()
		case <-expiry:
			expiry = nil
			if !reload() && ctx.Err() == nil {
				// Cut off from the store: apply the expiry on this process's own
				// estimate of the store's clock, as every holder does (regions.ExpiryGrace
				// bounds how far apart they are), so this region ends an override when the
				// others do instead of keeping it for as long as the cut lasts.
				r.expireLocally(base.at.Add(time.Since(base.start)))
				armExpiry()
			}
		case <-ticker.C:
			reload()
		}
	}
}

// expireLocally swaps in the current snapshot with its shares judged at store time at
// (Snapshot.At), for a holder that cannot reload; OnReload sees it as a new snapshot.
func (r *Reloader) expireLocally(at time.Time) {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	cur := r.Current()
	if cur == nil {
		return
	}
	next := cur.At(at)
	if next == cur {
		return
	}
	r.cur.Store(next)
	r.m.localExpiries.Inc()
	r.log.Warn("share expiry applied without the store (cut off); by this process's clock",
		"as_of", at, "next_expiry", next.NextExpiry())
	if r.opts.OnReload != nil {
		r.opts.OnReload(next)
	}
}

// notify asks Run for a (debounced) reload.
func (r *Reloader) notify() {
	select {
	case r.kick <- struct{}{}:
	default: // one is pending already
	}
}

// listen keeps a LISTEN connection open until ctx ends, reconnecting with backoff. It
// closes first when the first attempt has succeeded or failed.
func (r *Reloader) listen(ctx context.Context, first chan<- struct{}) {
	delay := listenBackoff
	lost := false
	firstDone := func() {
		if first != nil {
			close(first)
			first = nil
		}
	}
	defer firstDone()
	for {
		up := false
		err := r.listenOnce(ctx, func() {
			firstDone()
			up = true
			delay = listenBackoff
			if lost {
				r.log.Info("config listen restored", "channel", NotifyChannel)
				lost = false
				r.notify() // changes may have happened while we were away
			}
		})
		firstDone()
		if ctx.Err() != nil {
			return
		}
		if !lost {
			r.log.Warn("config listen lost; reloading on the timer only until it is back", "channel", NotifyChannel, "err", err)
			lost = true
		}
		if !up {
			delay = min(2*delay, listenMaxDelay)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// listenOnce connects, LISTENs (then calls onUp), and forwards notifications until the
// connection fails or ctx ends.
func (r *Reloader) listenOnce(ctx context.Context, onUp func()) error {
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	conn, err := pgx.Connect(cctx, r.opts.ListenURL)
	cancel()
	if err != nil {
		return redactErr(fmt.Errorf("listen connect: %w", err), URLSecrets(r.opts.ListenURL))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel}.Sanitize()); err != nil {
		return fmt.Errorf("listen %s: %w", NotifyChannel, err)
	}
	onUp()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			r.notify()
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			// Idle: make sure the connection is still there (a silent network loss
			// would otherwise leave us waiting forever).
			pctx, cancel := context.WithTimeout(ctx, connectTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("listen ping: %w", err)
			}
		default:
			return fmt.Errorf("listen wait: %w", err)
		}
	}
}
