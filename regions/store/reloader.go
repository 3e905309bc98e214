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
	// swapMu orders the swaps of cur (a load's and a local expiry's) and guards base:
	// the last load's store time (AsOf) and when, on this process's monotonic clock, it
	// started, so base.at + time.Since(base.start) estimates the store's clock (ahead of
	// it by at most that load's latency, plus this clock's drift).
	swapMu sync.Mutex
	base   struct{ at, start time.Time }
	rearm  chan struct{} // buffered 1: cur changed, so the expirer times the next expiry again
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
	return &Reloader{opts: o, log: log, kick: make(chan struct{}, 1), rearm: make(chan struct{}, 1), m: newReloaderMetrics(o.Registerer)}
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
			Help: "Share expiries applied to the snapshot held, on this process's estimate of the store's clock, before a load confirmed them (at every expiry; a holder cut off from the store keeps them).",
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
	s = r.swapLoaded(s, start)
	if r.failed {
		r.log.Info("config reload recovered", "rules", s.RuleCount())
	}
	r.failed = false
	r.log.Debug("config reloaded", "rules", s.RuleCount(), "duration", time.Since(start))
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

	wg.Go(func() { r.expire(ctx) })
	ticker := time.NewTicker(r.opts.Interval)
	defer ticker.Stop()
	var (
		debounce   <-chan time.Time // pending coalesced notification
		retry      <-chan time.Time // pending retry after a failure
		retryDelay = retryMin
	)
	reload := func() {
		if err := r.Reload(ctx); err != nil {
			if ctx.Err() == nil {
				retry = time.After(retryDelay)
				retryDelay = min(2*retryDelay, r.opts.Interval)
			}
			return
		}
		retry, retryDelay = nil, retryMin
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
		case <-ticker.C:
			reload()
		}
	}
}

// swapLoaded makes s, a load that started at start, the current snapshot, and returns
// what it swapped in: s, or s judged at the current snapshot's time when a local expiry
// (expireLocally) has already judged past s's (a load that started before an expiry and
// ended after it), so an expiry once applied is never undone. OnReload runs within the
// swap, so the holder sees the snapshots in the order they were swapped in.
func (r *Reloader) swapLoaded(s *regions.Snapshot, start time.Time) *regions.Snapshot {
	r.swapMu.Lock()
	defer r.swapMu.Unlock()
	r.base.at, r.base.start = s.AsOf(), start
	if cur := r.cur.Load(); cur != nil && cur.AsOf().After(s.AsOf()) {
		s = s.At(cur.AsOf())
	}
	r.cur.Store(s)
	r.rearmExpiry()
	if r.opts.OnReload != nil {
		r.opts.OnReload(s)
	}
	return s
}

func (r *Reloader) rearmExpiry() {
	select {
	case r.rearm <- struct{}{}:
	default:
	}
}

// expire applies every expiry state change of the current snapshot (NextExpiry) at its
// time, on this process's estimate of the store's clock, whether or not the store
// answers and whether or not a load is under way (one may hang for LoadTimeout behind a
// stalled connection): every holder does the same (regions.ExpiryGrace bounds how far
// apart they are), so a gateway cut off from the store, or stuck in a load, ends an
// override when the others do. It then asks for a reload, which confirms it. It returns
// when ctx ends.
func (r *Reloader) expire(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		timer.Stop()
		armed := false
		r.swapMu.Lock()
		s, base := r.cur.Load(), r.base
		r.swapMu.Unlock()
		if s != nil && !s.NextExpiry().IsZero() && !base.at.IsZero() {
			timer.Reset(max(s.NextExpiry().Sub(base.at)-time.Since(base.start), 0) + expiryMargin)
			armed = true
		}
		var fire <-chan time.Time
		if armed {
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-r.rearm:
		case <-fire:
			r.expireLocally()
			r.notify()
		}
	}
}

// expireLocally swaps in the current snapshot with its shares judged at this process's
// estimate of the store's clock (Snapshot.At); OnReload sees it as a new snapshot.
func (r *Reloader) expireLocally() {
	r.swapMu.Lock()
	defer r.swapMu.Unlock()
	cur := r.cur.Load()
	if cur == nil || r.base.at.IsZero() {
		return
	}
	at := r.base.at.Add(time.Since(r.base.start))
	next := cur.At(at)
	if next == cur {
		return
	}
	r.cur.Store(next)
	r.m.localExpiries.Inc()
	r.log.Info("share expiry applied by this process's clock; a reload confirms it",
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
