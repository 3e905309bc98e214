package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultInstanceTTL is how long after its last heartbeat a gateway that has not stopped
// counts as live for PlanDown when DownOptions.InstanceTTL is zero: the same 15 s as
// regions/store.DefaultInstanceTTL (this package imports nothing of the module).
const DefaultInstanceTTL = 15 * time.Second

// DownOptions say which of PlanDown's refusals DownChecked overrides.
type DownOptions struct {
	// InstanceTTL: a gateway_instance row seen within it and not stopped is a live
	// gateway. Zero means DefaultInstanceTTL.
	InstanceTTL time.Duration
	// AllowLiveGateways rolls back while gateways run on the schema: a gateway whose
	// next reload reads a table or function the step removes fails it and keeps
	// enforcing the snapshot it has until the schema is migrated up again.
	AllowLiveGateways bool
	// AllowDataLoss rolls back a step that drops tables or columns that hold rows, or
	// deletes rows: they are gone for good (a later up does not bring them back).
	AllowDataLoss bool
	// AllowUnprotected rolls back a step that removes the default rule, the audit and
	// share-history triggers, or the append-only and least-privilege protections: from
	// then on writes go unrecorded, or the audit trail can be erased.
	AllowUnprotected bool
}

// RefusalKind is why a roll back is refused.
type RefusalKind string

// Refusal kinds, each overridden by one DownOptions field.
const (
	RefusalLiveGateways RefusalKind = "live_gateways" // AllowLiveGateways
	RefusalDataLoss     RefusalKind = "data_loss"     // AllowDataLoss
	RefusalProtection   RefusalKind = "protection"    // AllowUnprotected
)

// Refusal is one reason not to roll back a migration.
type Refusal struct {
	Kind   RefusalKind `json:"kind"`
	Detail string      `json:"detail"`
}

// DownPlan is what rolling back the newest applied migration would do.
type DownPlan struct {
	Version  int64     `json:"version"`
	Name     string    `json:"name"` // file name, e.g. "00009_roles.sql"
	Refusals []Refusal `json:"refusals"`
}

// Blocking is the refusals of p that o does not override.
func (p DownPlan) Blocking(o DownOptions) []Refusal {
	var out []Refusal
	for _, r := range p.Refusals {
		switch {
		case r.Kind == RefusalLiveGateways && o.AllowLiveGateways,
			r.Kind == RefusalDataLoss && o.AllowDataLoss,
			r.Kind == RefusalProtection && o.AllowUnprotected:
			continue
		}
		out = append(out, r)
	}
	return out
}

// ErrDownRefused is wrapped by DownChecked's error when a refusal was not overridden.
var ErrDownRefused = errors.New("migrate down refused")

// ErrNothingApplied is returned by PlanDown and DownChecked for a database with no
// migration applied.
var ErrNothingApplied = errors.New("no migration is applied")

// PlanDown says what rolling back the newest applied migration would do, and why it
// should not: gateways live on the schema (o.InstanceTTL), rows or columns holding data
// that the step drops, protections it removes. It writes nothing.
func PlanDown(ctx context.Context, db *sql.DB, o DownOptions) (DownPlan, error) {
	st, err := Status(ctx, db)
	if err != nil {
		return DownPlan{}, err
	}
	var p DownPlan
	for _, s := range st {
		if s.Applied {
			p.Version, p.Name = s.Version, s.Name
		}
	}
	if p.Version == 0 {
		return DownPlan{}, ErrNothingApplied
	}
	ttl := o.InstanceTTL
	if ttl <= 0 {
		ttl = DefaultInstanceTTL
	}
	live, err := liveGateways(ctx, db, p.Version, ttl)
	if err != nil {
		return DownPlan{}, fmt.Errorf("plan migrate down: %w", err)
	}
	if live != "" {
		p.Refusals = append(p.Refusals, Refusal{RefusalLiveGateways, fmt.Sprintf(
			"gateways are live on this schema (heartbeat within %s, not stopped): %s; stop them, or roll back knowing their next reload may fail", ttl, live)})
	}
	check, ok := downChecks[p.Version]
	if !ok {
		p.Refusals = append(p.Refusals, Refusal{RefusalProtection, fmt.Sprintf(
			"migration %d has no roll-back checks in this ratectl (a newer release's migration?): use that release's ratectl", p.Version)})
		return p, nil
	}
	rs, err := check(ctx, db)
	if err != nil {
		return DownPlan{}, fmt.Errorf("plan migrate down of %d (%s): %w", p.Version, p.Name, err)
	}
	p.Refusals = append(p.Refusals, rs...)
	return p, nil
}

// DownChecked rolls back the newest applied migration unless PlanDown refuses it for a
// reason o does not override; it then writes nothing and returns the plan with an error
// wrapping ErrDownRefused that names every reason. The checks and the roll back are not
// one transaction: a gateway starting in between is not seen.
func DownChecked(ctx context.Context, db *sql.DB, o DownOptions) (DownPlan, error) {
	p, err := PlanDown(ctx, db, o)
	if err != nil {
		return p, err
	}
	if b := p.Blocking(o); len(b) > 0 {
		msgs := make([]string, len(b))
		for i, r := range b {
			msgs[i] = fmt.Sprintf("%s: %s", r.Kind, r.Detail)
		}
		return p, fmt.Errorf("%w: rolling back migration %d (%s): %s", ErrDownRefused, p.Version, p.Name, strings.Join(msgs, "; "))
	}
	if err := Down(ctx, db); err != nil {
		return p, err
	}
	return p, nil
}

// liveGateways lists the gateways seen within ttl and not stopped, "" for none.
func liveGateways(ctx context.Context, db *sql.DB, version int64, ttl time.Duration) (string, error) {
	if version < 1 {
		return "", nil
	}
	q := `SELECT count(*), coalesce(string_agg(id || ' (' || region || ')', ', ' ORDER BY id), '')
		FROM gateway_instance WHERE last_seen > now() - $1::bigint * interval '1 microsecond'`
	if version >= 7 {
		q += ` AND stopped_at IS NULL`
	}
	var (
		n   int
		ids string
	)
	if err := db.QueryRowContext(ctx, q, ttl.Microseconds()).Scan(&n, &ids); err != nil {
		return "", fmt.Errorf("live gateways: %w", err)
	}
	if n == 0 {
		return "", nil
	}
	if n > 10 {
		ids = fmt.Sprintf("%d gateways", n)
	}
	return ids, nil
}

// downChecks holds, for each migration, what rolling it back would lose or remove. A
// migration without an entry cannot be rolled back by DownChecked (TestDownChecksCover
// keeps this complete).
var downChecks = map[int64]func(ctx context.Context, db *sql.DB) ([]Refusal, error){
	1: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops every table", []counted{
			{"rate_limit_rule", "rules", ""}, {"api_key", "API keys", ""}, {"region", "regions", ""},
			{"region_share", "shares", ""}, {"region_share_history", "share history rows", ""},
			{"audit_log", "audit rows", ""}, {"gateway_instance", "gateway heartbeats", ""},
		})
	},
	2: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		n, err := count(ctx, db, counted{"rate_limit_rule", "", `tenant_id = '*' AND route_id = '*'`})
		if err != nil || n == 0 {
			return nil, err
		}
		return []Refusal{{RefusalProtection,
			"deletes the default rule (tenant *, route *): every gateway's next reload fails (a snapshot needs it) and a new gateway cannot start"}}, nil
	},
	3: func(context.Context, *sql.DB) ([]Refusal, error) {
		return []Refusal{{RefusalProtection,
			"drops the audit, share-history and notification triggers and the default rule's protection: changes are no longer recorded in audit_log or region_share_history, and gateways are no longer told of them"}}, nil
	},
	4: noLoss,
	5: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops rebalancer_lease (the fencing epoch; a running rebalancer is fenced until it takes a new one)",
			[]counted{{"rebalancer_lease", "lease rows", ""}})
	},
	6: noLoss,
	7: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "deletes the heartbeats of cleanly stopped gateways and drops gateway_instance.stopped_at",
			[]counted{{"gateway_instance", "stopped gateways", "stopped_at IS NOT NULL"}})
	},
	8: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops limit_raise (gateways stop holding raised buckets to the old limit) and gateway_instance.snapshot_xmin",
			[]counted{{"limit_raise", "raise markers", ""}, {"gateway_instance", "snapshot acknowledgments", "snapshot_xmin IS NOT NULL"}})
	},
	9: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		rs, err := dataLoss(ctx, db, "drops the on_behalf_of columns of audit_log and region_share_history",
			[]counted{{"audit_log", "audit rows naming on_behalf_of", "on_behalf_of IS NOT NULL"},
				{"region_share_history", "history rows naming on_behalf_of", "on_behalf_of IS NOT NULL"}})
		if err != nil {
			return nil, err
		}
		return append(rs, Refusal{RefusalProtection,
			"removes the append-only triggers of audit_log and region_share_history, the TRUNCATE refusals, the actor stamping and the component roles' grants: any role may then rewrite or erase the audit trail, and the component roles can no longer read or write"}), nil
	},
	10: noLoss, // statement-level raise triggers back to row-level ones
	11: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops plan, plan_rule and tenant_plan (the tenants of a plan fall back to the default rules)",
			[]counted{{"plan", "plans", ""}, {"plan_rule", "plan rules", ""}, {"tenant_plan", "tenant plan assignments", ""}})
	},
	12: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops the bands of rules and plan rules (their further limits are no longer enforced)",
			[]counted{{"rate_limit_rule", "rules with bands", "bands <> '[]'"}, {"plan_rule", "plan rules with bands", "bands <> '[]'"}})
	},
	13: func(ctx context.Context, db *sql.DB) ([]Refusal, error) {
		return dataLoss(ctx, db, "drops the calendar quota bands of rules and plan rules (no longer enforced) and quota_usage (what each region has counted of them)",
			[]counted{{"rate_limit_rule", "rules with quota bands", `jsonb_path_exists(bands, '$[*].period')`},
				{"plan_rule", "plan rules with quota bands", `jsonb_path_exists(bands, '$[*].period')`},
				{"quota_usage", "quota usage rows", ""}})
	},
}

func noLoss(context.Context, *sql.DB) ([]Refusal, error) { return nil, nil }

// counted is rows of table matching where ("" = all), described as what.
type counted struct{ table, what, where string }

func count(ctx context.Context, db *sql.DB, c counted) (int64, error) {
	q := "SELECT count(*) FROM " + c.table // table names are constants of this file
	if c.where != "" {
		q += " WHERE " + c.where
	}
	var n int64
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("count %s: %w", c.table, err)
	}
	return n, nil
}

// dataLoss is one RefusalDataLoss naming the rows of cs the step would lose, or none
// when they are all empty.
func dataLoss(ctx context.Context, db *sql.DB, step string, cs []counted) ([]Refusal, error) {
	var lost []string
	for _, c := range cs {
		n, err := count(ctx, db, c)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			lost = append(lost, fmt.Sprintf("%d %s", n, c.what))
		}
	}
	if len(lost) == 0 {
		return nil, nil
	}
	return []Refusal{{RefusalDataLoss, fmt.Sprintf("%s, losing %s", step, strings.Join(lost, ", "))}}, nil
}
