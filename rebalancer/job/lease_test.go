package job_test

import (
	"context"
	"math"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/migrations"
	"github.com/quotaplane/quotaplane/rebalancer/job"
)

// TestBrokenLeaseIsRepaired (issue 22): a lease row edited by hand, reset by `migrate
// down` + `up`, or deleted fenced the leader for ever (every write refused, no replica
// able to take over, since the leader still holds the lock). The leader, which still
// holds the lock, takes a new epoch, says so in an error log and a metric, and writes.
func TestBrokenLeaseIsRepaired(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, w *world)
	}{
		{"epoch edited", func(t *testing.T, w *world) {
			exec(t, w, `UPDATE rebalancer_lease SET epoch = 5`)
		}},
		{"row deleted", func(t *testing.T, w *world) {
			exec(t, w, `DELETE FROM rebalancer_lease`)
		}},
		{"migrate down and up", func(t *testing.T, w *world) {
			db := stdlib.OpenDBFromPool(w.store.Pool())
			defer db.Close()
			for {
				v, err := migrations.Version(t.Context(), db)
				if err != nil {
					t.Fatal(err)
				}
				if v < 5 {
					break
				}
				if err := migrations.Down(t.Context(), db); err != nil {
					t.Fatal(err)
				}
			}
			if err := migrations.Up(t.Context(), db); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, "us-east", "eu-west")
			el := newElector(t, w.url)
			if err := el.IsLeader(t.Context()); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewPedanticRegistry()
			j := w.job(t, reg, func(c *job.Config) { c.Elector = el })
			tc.breakIt(t, w)
			w.dem.set(map[string]float64{"us-east": 70, "eu-west": 30})
			rep, err := j.RunOnce(t.Context())
			if err != nil || rep.Result != job.ResultOK || rep.Retried != job.ResultFenced {
				t.Fatalf("run after the lease broke: result %q retried %q err %v; want ok after a repaired fence", rep.Result, rep.Retried, err)
			}
			if got := w.globalShares(t); math.Abs(got["us-east"]-0.7) > 1e-6 {
				t.Errorf("* shares %v, want us-east 0.7 written", got)
			}
			if n := metric(t, reg, "ratelimit_rebalancer_lease_repairs_total", "outcome", "repaired"); n != 1 {
				t.Errorf("lease repairs = %v, want 1", n)
			}
			// Another replica still cannot lead while this one holds the lock, and the
			// lease names this one's new epoch.
			other := newElector(t, w.url)
			if got := leaders(t, el, other); len(got) != 1 || got[0] != 0 {
				t.Errorf("leaders after the repair: %v, want only the first", got)
			}
			var epoch int64
			if err := w.store.Pool().QueryRow(t.Context(), `SELECT epoch FROM rebalancer_lease`).Scan(&epoch); err != nil || epoch != el.Epoch() {
				t.Errorf("lease epoch %d (%v), want the leader's %d", epoch, err, el.Epoch())
			}
		})
	}
}

// TestDeletedLeaseRowLetsANewLeaderIn: with the lease row gone and no leader, a
// rebalancer can lead again (it recreated the row; before, taking the lock failed on
// the missing row for ever).
func TestDeletedLeaseRowLetsANewLeaderIn(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "us-east", "eu-west")
	exec(t, w, `DELETE FROM rebalancer_lease`)
	el := newElector(t, w.url)
	if err := el.IsLeader(t.Context()); err != nil {
		t.Fatalf("no leader without a lease row: %v", err)
	}
	if el.Epoch() <= 0 {
		t.Errorf("epoch %d, want > 0", el.Epoch())
	}
}

func exec(t *testing.T, w *world, q string) {
	t.Helper()
	if _, err := w.store.Pool().Exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
