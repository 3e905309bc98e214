package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// Retry pacing of lazyStore: a failed open is retried no sooner than a backoff that
// doubles from minOpenBackoff to maxOpenBackoff. The ticks (every --check-interval) are
// what retries; the backoff only keeps status page views from hammering a dead server.
const (
	minOpenBackoff = 500 * time.Millisecond
	maxOpenBackoff = 10 * time.Second
)

// errOpening is returned while another caller is opening the store.
var errOpening = errors.New("database: connecting")

// lazyStore is the control-plane store, opened on first use and retried until it opens:
// the rebalancer starts, and serves /healthz and the status page (503 without the
// database), while PostgreSQL is down; each tick then fails as skipped_database until it
// is back. Once open, the pool reconnects by itself. It implements job.Store and
// status.Store.
type lazyStore struct {
	url string
	log *slog.Logger

	mu      sync.Mutex
	store   *store.Store
	opening bool
	lastErr error // the last open's error; nil before the first failure
	retryAt time.Time
	backoff time.Duration
	closed  bool
}

func newLazyStore(url string, log *slog.Logger) *lazyStore {
	return &lazyStore{url: url, log: log}
}

// get returns the open store, opening it when the backoff allows. Errors of a malformed
// URL wrap regions.ErrInvalid (store.Open); no error shows the password.
func (l *lazyStore) get(ctx context.Context) (*store.Store, error) {
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return nil, errors.New("database: store closed")
	case l.store != nil:
		s := l.store
		l.mu.Unlock()
		return s, nil
	case l.opening:
		l.mu.Unlock()
		return nil, errOpening
	case time.Now().Before(l.retryAt):
		err := fmt.Errorf("database: not connected, next attempt in %s: %w", time.Until(l.retryAt).Round(time.Millisecond), l.lastErr)
		l.mu.Unlock()
		return nil, err
	}
	l.opening = true
	l.mu.Unlock()

	s, err := store.Open(ctx, l.url)

	l.mu.Lock()
	defer l.mu.Unlock()
	l.opening = false
	if err != nil {
		l.backoff = min(max(2*l.backoff, minOpenBackoff), maxOpenBackoff)
		l.retryAt = time.Now().Add(l.backoff)
		if l.lastErr == nil {
			l.log.Warn("postgresql unreachable; runs are skipped until it is back", "err", err)
		}
		l.lastErr = err
		return nil, err
	}
	if l.closed {
		s.Close()
		return nil, errors.New("database: store closed")
	}
	if l.lastErr != nil {
		l.log.Info("postgresql reachable again")
	}
	l.store, l.lastErr, l.backoff, l.retryAt = s, nil, 0, time.Time{}
	return s, nil
}

// Close closes the store if it was opened; later calls fail.
func (l *lazyStore) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.store != nil {
		l.store.Close()
		l.store = nil
	}
}

// Load implements job.Store.
func (l *lazyStore) Load(ctx context.Context, o store.LoadOptions) (*regions.Snapshot, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Load(ctx, o)
}

// WriteRebalancer implements job.Store.
func (l *lazyStore) WriteRebalancer(ctx context.Context, w store.RebalancerWrite) error {
	s, err := l.get(ctx)
	if err != nil {
		return err
	}
	return s.WriteRebalancer(ctx, w)
}

// Regions implements status.Store.
func (l *lazyStore) Regions(ctx context.Context) ([]string, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Regions(ctx)
}

// Instances implements status.Store.
func (l *lazyStore) Instances(ctx context.Context) ([]regions.Instance, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Instances(ctx)
}

// Shares implements status.Store.
func (l *lazyStore) Shares(ctx context.Context) ([]regions.Share, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.Shares(ctx)
}

// History implements status.Store.
func (l *lazyStore) History(ctx context.Context, f store.HistoryFilter) ([]store.HistoryEntry, error) {
	s, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	return s.History(ctx, f)
}
