package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// DefaultLockKey is the advisory lock every rebalancer of one database competes for
// ("quotaplane-rebalancer" in ASCII, truncated to 8 bytes: 0x71756f7461706c61).
const DefaultLockKey int64 = 0x71756f7461706c61

// ErrNotLeader is returned by Elector.IsLeader when another rebalancer holds the lock, or
// when the database cannot be reached (no lock, no leadership).
var ErrNotLeader = errors.New("not the leader")

// ErrDatabaseUnavailable is wrapped, besides ErrNotLeader, when IsLeader could not reach
// PostgreSQL: Run counts such a tick as skipped_database, not not_leader.
var ErrDatabaseUnavailable = errors.New("database unavailable")

// ErrLockLost is wrapped, besides ErrNotLeader, when the leader found the connection that
// held its lock gone (idle_session_timeout after a stall, a terminated backend, a
// PostgreSQL restart): leadership ended, and the next tick tries to take it again. It
// is not ErrDatabaseUnavailable: PostgreSQL may well be reachable.
var ErrLockLost = errors.New("leader lock lost")

// Elector is gocron's distributed elector backed by a PostgreSQL session advisory lock:
// the leader is the process whose dedicated connection holds pg_try_advisory_lock(key).
// The lock lives as long as that connection, so when the leader dies (or its connection
// does) PostgreSQL releases it and another rebalancer takes it on its next tick.
//
// A leader that is stopped (SIGSTOP, a long GC or VM pause) or cut off keeps a live TCP
// connection, so the connection sets idle_session_timeout to SessionTimeout: the leader
// uses it at every tick (IsLeader), and PostgreSQL ends a session idle for longer, which
// releases the lock. So another rebalancer takes over at most SessionTimeout plus one of
// its tick periods after the leader stopped.
//
// Fencing: on taking the lock the Elector increments the epoch of the rebalancer_lease
// row on the same connection; Epoch returns it, and every write of the Job checks it in
// its own transaction (store.RebalancerWrite.Epoch). A leader that lost the lock can
// therefore not write once another has taken it. It is safe for concurrent use.
type Elector struct {
	url     string
	key     int64
	timeout time.Duration
	log     *slog.Logger

	sessionTimeout time.Duration
	holder         string

	mu     sync.Mutex
	conn   *pgx.Conn
	leader bool
	epoch  int64 // the lease epoch taken with the lock; 0 while not leading
	closed bool
}

// ElectorConfig configures NewElector.
type ElectorConfig struct {
	// DatabaseURL is the PostgreSQL the lock lives in (the store's database).
	DatabaseURL string
	// LockKey is the advisory lock key; 0 means DefaultLockKey.
	LockKey int64
	// Timeout bounds connecting and each query; 0 means 5 s.
	Timeout time.Duration
	// SessionTimeout is the lock connection's idle_session_timeout: a leader that has not
	// asked IsLeader for this long (stopped, cut off) loses its session and the lock. It
	// must exceed the longest gap between two ticks (the check interval plus a tick's
	// duration); 0 means DefaultSessionTimeout.
	SessionTimeout time.Duration
	// Holder names this rebalancer in rebalancer_lease (default host:pid).
	Holder string
	Logger *slog.Logger
}

// DefaultSessionTimeout is ElectorConfig.SessionTimeout's default: twice the default
// check interval plus ten seconds.
const DefaultSessionTimeout = 2*DefaultCheckInterval + 10*time.Second

// NewElector validates cfg; it dials nothing until the first IsLeader.
func NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.DatabaseURL == "" {
		return nil, fmt.Errorf("%w elector: no database url", regions.ErrInvalid)
	}
	if _, err := pgx.ParseConfig(cfg.DatabaseURL); err != nil {
		return nil, fmt.Errorf("%w elector: database url %s does not parse", regions.ErrInvalid, store.RedactURL(cfg.DatabaseURL))
	}
	if cfg.LockKey == 0 {
		cfg.LockKey = DefaultLockKey
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.SessionTimeout < time.Second {
		return nil, fmt.Errorf("%w elector: session timeout %s must be at least 1s", regions.ErrInvalid, cfg.SessionTimeout)
	}
	if cfg.Holder == "" {
		host, _ := os.Hostname()
		cfg.Holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	return &Elector{url: cfg.DatabaseURL, key: cfg.LockKey, timeout: cfg.Timeout, sessionTimeout: cfg.SessionTimeout,
		holder: cfg.Holder, log: orDiscard(cfg.Logger)}, nil
}

// IsLeader returns nil while this process holds the lock, taking it when it is free; else
// an error wrapping ErrNotLeader. A leader checks its connection on every call, so a lost
// connection (and with it the lock) ends leadership at the next tick.
func (e *Elector) IsLeader(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return fmt.Errorf("%w: elector closed", ErrNotLeader)
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	if e.conn == nil || e.conn.IsClosed() {
		e.setLeader(false)
		cfg, err := pgx.ParseConfig(e.url)
		if err != nil { // NewElector parsed it; pgx's parse errors redact the password
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		cfg.ConnectTimeout = e.timeout
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		cfg.RuntimeParams["application_name"] = "quotaplane-rebalancer-lock"
		cfg.RuntimeParams["idle_session_timeout"] = strconv.FormatInt(e.sessionTimeout.Milliseconds(), 10)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("%w: %w: connect to %s for the lock: %w", ErrNotLeader, ErrDatabaseUnavailable, store.RedactURL(e.url), err)
		}
		e.conn = conn
	}
	if e.leader {
		// The session still holds the lock as long as it is alive.
		if _, err := e.conn.Exec(ctx, "SELECT 1"); err != nil {
			e.dropConn()
			return fmt.Errorf("%w: %w: its connection ended: %w", ErrNotLeader, ErrLockLost, err)
		}
		return nil
	}
	var got bool
	if err := e.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", e.key).Scan(&got); err != nil {
		e.dropConn()
		return fmt.Errorf("%w: %w: try advisory lock %d: %w", ErrNotLeader, ErrDatabaseUnavailable, e.key, err)
	}
	if !got {
		return fmt.Errorf("%w: advisory lock %d is held by another rebalancer", ErrNotLeader, e.key)
	}
	epoch, err := e.takeEpoch(ctx)
	if err != nil {
		e.dropConn() // releases the lock
		return fmt.Errorf("%w: take the rebalancer lease (is the schema migrated?): %w", ErrNotLeader, err)
	}
	e.epoch = epoch
	e.setLeader(true)
	return nil
}

// takeEpoch fences off every earlier leader (their writes check the epoch) and returns
// the new epoch; the caller holds the lock. It waits for a write in progress (it holds
// the row FOR SHARE) to commit first.
//
// The new epoch is above every epoch ever handed out even when the row was reset or
// lost: at least the database clock in milliseconds, and above the row's value. A lease
// row deleted (by hand) is recreated; one recreated at 0 by `migrate down` + `up`, or
// edited back, cannot give a new leader the epoch a stalled old one still holds.
func (e *Elector) takeEpoch(ctx context.Context) (int64, error) {
	var epoch int64
	err := e.conn.QueryRow(ctx, `
		INSERT INTO rebalancer_lease (id, holder, epoch, acquired_at)
		VALUES (1, $1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, now())
		ON CONFLICT (id) DO UPDATE SET
			epoch = greatest(rebalancer_lease.epoch + 1, EXCLUDED.epoch),
			holder = EXCLUDED.holder, acquired_at = now()
		RETURNING epoch`, e.holder).Scan(&epoch)
	return epoch, err
}

// ErrLeaseBroken is wrapped by RepairLease's error when the lease row could not be
// repaired although this process holds the lock.
var ErrLeaseBroken = errors.New("rebalancer lease broken")

// RepairLease is called after a write was refused as fenced. If this process still
// holds the lock (its session is alive and holds the advisory lock), no other rebalancer
// can have taken over: the lease row was changed by something else — an epoch edited by
// hand, `migrate down` + `up`, a deleted row — and would fence the leader for ever. It
// then takes a new epoch (takeEpoch) and reports true. It reports false, and ends the
// leadership, when the lock is gone (a takeover: the refusal was right).
func (e *Elector) RepairLease(ctx context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leader || e.conn == nil || e.conn.IsClosed() {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	var held bool
	if err := e.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND pid = pg_backend_pid() AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1)`,
		int64(uint64(e.key)>>32), int64(uint64(e.key)&0xffffffff)).Scan(&held); err != nil {
		e.dropConn()
		return false, nil
	}
	if !held {
		e.dropConn()
		return false, nil
	}
	old := e.epoch
	epoch, err := e.takeEpoch(ctx)
	if err != nil {
		return false, fmt.Errorf("%w: the leader holds the lock but cannot rewrite the lease row: %w", ErrLeaseBroken, err)
	}
	e.epoch = epoch
	e.log.Error("rebalancer lease changed while this rebalancer held the leader lock (edited by hand, migrate down and up, or a deleted row); took a new epoch",
		"lock_key", e.key, "old_epoch", old, "epoch", epoch)
	return true, nil
}

// Epoch is the lease epoch this process took with the lock (the fencing token its writes
// carry); 0 while it does not lead.
func (e *Elector) Epoch() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leader {
		return 0
	}
	return e.epoch
}

// Leader reports whether the last IsLeader found this process the leader.
func (e *Elector) Leader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader
}

// Close releases the lock by closing the connection; IsLeader fails afterwards.
func (e *Elector) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	if e.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	if e.leader {
		// Unlock before closing: a closed connection's backend releases the lock only
		// when PostgreSQL gets to it, and another rebalancer asking at once would be
		// refused. If this fails, closing releases it all the same.
		_, _ = e.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", e.key)
	}
	err := e.conn.Close(ctx)
	e.conn = nil
	e.setLeader(false)
	return err
}

// dropConn closes a broken connection; PostgreSQL releases whatever it held.
func (e *Elector) dropConn() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = e.conn.Close(ctx)
	e.conn = nil
	e.setLeader(false)
}

func (e *Elector) setLeader(v bool) {
	if !v {
		e.epoch = 0
	}
	if e.leader == v {
		return
	}
	e.leader = v
	if v {
		e.log.Info("became leader", "lock_key", e.key, "epoch", e.epoch)
	} else {
		e.log.Warn("lost leadership", "lock_key", e.key)
	}
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
