package job_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// migratedDB is a new database with the schema (the elector's lease row).
func migratedDB(t *testing.T) string {
	t.Helper()
	url := testenv.PostgresDB(t)
	st, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return url
}

func newElector(t *testing.T, dbURL string) *job.Elector {
	t.Helper()
	e, err := job.NewElector(job.ElectorConfig{DatabaseURL: dbURL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// leaders asks each elector in turn and returns the indexes that lead.
func leaders(t *testing.T, els ...*job.Elector) []int {
	t.Helper()
	var out []int
	for i, e := range els {
		err := e.IsLeader(t.Context())
		switch {
		case err == nil:
			out = append(out, i)
		case !errors.Is(err, job.ErrNotLeader) || errors.Is(err, job.ErrDatabaseUnavailable):
			t.Fatalf("elector %d: %v, want nil or ErrNotLeader (the database is up)", i, err)
		}
	}
	return out
}

func TestElectorExactlyOneLeader(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	a, b := newElector(t, db), newElector(t, db)
	for range 5 {
		if got := leaders(t, a, b); len(got) != 1 || got[0] != 0 {
			t.Fatalf("leaders = %v, want exactly the first to ask [0]", got)
		}
	}
	// A third one on another database does not compete.
	if got := leaders(t, newElector(t, migratedDB(t))); len(got) != 1 {
		t.Fatalf("elector on another database: leaders = %v, want it to lead", got)
	}
}

func TestElectorReleasedOnClose(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	a, b := newElector(t, db), newElector(t, db)
	if got := leaders(t, a, b); len(got) != 1 || got[0] != 0 {
		t.Fatalf("leaders = %v, want [0]", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := leaders(t, a, b); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after the leader closed: leaders = %v, want [1]", got)
	}
}

// TestElectorReleasedWhenConnectionDies kills the leader's session in PostgreSQL, as a
// crashed process or a dropped connection would: the lock is released at once and the
// other takes it; the old leader learns it lost on its next tick.
func TestElectorReleasedWhenConnectionDies(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	a, b := newElector(t, db), newElector(t, db)
	if got := leaders(t, a, b); len(got) != 1 || got[0] != 0 {
		t.Fatalf("leaders = %v, want [0]", got)
	}
	conn, err := pgx.Connect(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the lock holder: %d sessions, %v", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.IsLeader(t.Context()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the follower did not take the lock within 5 s of the leader's session dying")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.IsLeader(t.Context()); !errors.Is(err, job.ErrNotLeader) || !errors.Is(err, job.ErrLockLost) || errors.Is(err, job.ErrDatabaseUnavailable) {
		t.Fatalf("old leader after its session died: %v, want ErrNotLeader and ErrLockLost, not ErrDatabaseUnavailable (PostgreSQL is up)", err)
	}
	if a.Leader() || !b.Leader() {
		t.Errorf("Leader(): a %v b %v, want false true", a.Leader(), b.Leader())
	}
}

func TestElectorDatabaseDownIsNotLeader(t *testing.T) {
	t.Parallel()
	e, err := job.NewElector(job.ElectorConfig{DatabaseURL: "postgres://postgres@127.0.0.1:1/x?sslmode=disable", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.IsLeader(t.Context()); !errors.Is(err, job.ErrNotLeader) || !errors.Is(err, job.ErrDatabaseUnavailable) {
		t.Fatalf("IsLeader with no database: %v, want ErrNotLeader and ErrDatabaseUnavailable", err)
	}
	if _, err := job.NewElector(job.ElectorConfig{}); !errors.Is(err, regions.ErrInvalid) {
		t.Fatalf("no url: %v, want ErrInvalid", err)
	}
}

// TestTwoRebalancersOneActs runs two scheduled rebalancers on one database: exactly one
// runs and writes; when it stops, the other takes over.
func TestTwoRebalancersOneActs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, testenv.PostgresDB(t))
	e.setDemand70_30()
	e.waitHistory(t)

	type instance struct {
		reg    *prometheus.Registry
		el     *job.Elector
		cancel context.CancelFunc
		done   chan error
	}
	start := func() *instance {
		in := &instance{reg: prometheus.NewPedanticRegistry(), el: newElector(t, e.dbURL), done: make(chan error, 1)}
		j := e.newJob(t, in.reg, func(c *job.Config) {
			c.Interval, c.CheckInterval, c.Elector = 500*time.Millisecond, 200*time.Millisecond, in.el
		})
		ctx, cancel := context.WithCancel(t.Context())
		in.cancel = cancel
		go func() { in.done <- j.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-in.done })
		return in
	}
	ok := func(in *instance) float64 {
		return metric(t, in.reg, "ratelimit_rebalancer_runs_total", "result", job.ResultOK) +
			metric(t, in.reg, "ratelimit_rebalancer_checks_total", "result", job.ResultOK)
	}
	notLeader := func(in *instance) float64 {
		return metric(t, in.reg, "ratelimit_rebalancer_runs_total", "result", job.ResultNotLeader)
	}
	writes := func(in *instance) float64 { return metric(t, in.reg, "ratelimit_rebalancer_share_writes_total") }

	a, b := start(), start()
	// Poll until one has acted 3 times and the other been refused 3 times: how long that
	// takes depends on the machine, not on the assertion.
	leader, follower := a, b
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader, follower = a, b
		if ok(b) > 0 {
			leader, follower = b, a
		}
		if ok(leader) >= 3 && notLeader(follower) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: a %v ok ticks and %v refusals, b %v and %v; want one >= 3 ok, the other >= 3 refusals",
				ok(a), notLeader(a), ok(b), notLeader(b))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok(follower) != 0 {
		t.Fatalf("both acted: leader %v ok ticks, follower %v", ok(leader), ok(follower))
	}
	if writes(leader) != 4 || writes(follower) != 0 {
		t.Errorf("share writes: leader %v, follower %v; want 4 and 0", writes(leader), writes(follower))
	}
	if got := metric(t, leader.reg, "ratelimit_rebalancer_leader"); got != 1 {
		t.Errorf("leader gauge = %v, want 1", got)
	}

	// The leader stops (its elector closes its connection, releasing the lock).
	leader.cancel()
	if err := <-leader.done; err != nil {
		t.Fatal(err)
	}
	leader.done <- nil // for the cleanup
	if err := leader.el.Close(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for ok(follower) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the follower did not take over within 5 s of the leader stopping")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Same demand: the new leader sees the shares already right and writes nothing.
	if got := writes(follower); got != 0 {
		t.Errorf("new leader wrote %v shares on unchanged demand, want 0", got)
	}
}

// TestStoppedLeaderLosesLeadership: a leader that stops asking (its process stopped by
// SIGSTOP, or cut off: from PostgreSQL's side its lock session just goes idle) loses the
// session, and with it the lock, SessionTimeout later; the other takes over, and the old
// leader's writes, carrying its epoch, are refused.
func TestStoppedLeaderLosesLeadership(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	const timeout = time.Second
	mk := func() *job.Elector {
		e, err := job.NewElector(job.ElectorConfig{DatabaseURL: db, Timeout: 2 * time.Second, SessionTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	a, b := mk(), mk()
	if got := leaders(t, a, b); len(got) != 1 || got[0] != 0 {
		t.Fatalf("leaders = %v, want [0]", got)
	}
	epochA := a.Epoch()
	start := time.Now()
	for b.IsLeader(t.Context()) != nil {
		if time.Since(start) > timeout+5*time.Second {
			t.Fatalf("the follower did not take over within %v of the leader going quiet", timeout+5*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("takeover %v after the leader went quiet (session timeout %v)", took, timeout)
	if took < timeout-100*time.Millisecond {
		t.Errorf("takeover after %v, before the session timeout %v: the leader was not given its time", took, timeout)
	}
	if b.Epoch() <= epochA {
		t.Fatalf("new epoch %d, old %d: want it incremented", b.Epoch(), epochA)
	}
	st, err := store.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.AddRegion(t.Context(), "us-east"); err != nil {
		t.Fatal(err)
	}
	err = st.WriteRebalancer(t.Context(), store.RebalancerWrite{Actor: "a", Epoch: epochA,
		Changes: []store.ShareChange{{Scope: regions.GlobalScope, Region: "us-east", New: 1}}})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("old leader's write: %v, want ErrFenced", err)
	}
	if err := st.WriteRebalancer(t.Context(), store.RebalancerWrite{Actor: "b", Epoch: b.Epoch(),
		Changes: []store.ShareChange{{Scope: regions.GlobalScope, Region: "us-east", New: 1}}}); err != nil {
		t.Fatalf("new leader's write: %v", err)
	}
	if err := a.IsLeader(t.Context()); !errors.Is(err, job.ErrNotLeader) {
		t.Fatalf("old leader resumed: %v, want ErrNotLeader", err)
	}
}
