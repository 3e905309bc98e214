package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// ChangeAction is what a Change does.
type ChangeAction string

const (
	ActionAdd    ChangeAction = "add"
	ActionChange ChangeAction = "change"
	ActionDelete ChangeAction = "delete" // a key is revoked instead
)

// Change is one planned write: one object added, changed or deleted, so one audit entry
// (rules, keys, regions, plans) or one history row per region (overrides). Its JSON is
// the plan that `ratectl diff`, `apply` and `rules set` print with -o json: Old and New
// are the object's values as numbers and lists (a *RuleValue for a rule or a plan_rule,
// *OverrideValue, *KeyValue or *TenantPlanValue; a region and a plan have none), absent
// for the side that does not exist.
type Change struct {
	Action ChangeAction `json:"action"`
	Object string       `json:"object"` // region, rule, override, key, plan, plan_rule, tenant_plan
	ID     string       `json:"id"`     // region name, TENANT/ROUTE, scope, sha256:hex prefix, plan, PLAN/ROUTE, tenant
	Old    ChangeValue  `json:"old,omitempty"`
	New    ChangeValue  `json:"new,omitempty"`

	apply func(ctx context.Context, tx pgx.Tx) error
	order int
	rule  regions.Rule // of a rule change: Apply writes every rule change in one statement per action
}

// ChangeValue is the state of one object on one side of a Change; String is the short
// prose the plan's table prints ("capacity 10, refill 2/s").
type ChangeValue interface {
	fmt.Stringer
	changeValue()
}

// RuleValue is a rule's bucket in a Change.
type RuleValue struct {
	Capacity        int64   `json:"capacity"`
	RefillPerSecond float64 `json:"refill_per_second"`
	Shadow          bool    `json:"shadow"`
	Shards          int     `json:"shards"`
	// Bands are the rule's further buckets; left out when it has none.
	Bands []regions.Band `json:"bands,omitempty"`
}

// RuleValueOf is the value of r in a Change.
func RuleValueOf(r regions.Rule) *RuleValue {
	shards := r.Shards
	if shards == 0 {
		shards = 1
	}
	return &RuleValue{Capacity: r.Capacity, RefillPerSecond: r.RefillPerSecond, Shadow: r.Shadow, Shards: shards, Bands: r.Bands}
}

func (*RuleValue) changeValue() {}

func (v *RuleValue) String() string {
	s := fmt.Sprintf("capacity %d, refill %g/s", v.Capacity, v.RefillPerSecond)
	if v.Shadow {
		s += ", shadow"
	}
	if v.Shards != 1 {
		s += fmt.Sprintf(", %d shards", v.Shards)
	}
	if len(v.Bands) > 0 {
		s += ", bands " + FormatBands(v.Bands)
	}
	return s
}

// OverrideValue is an operator override in a Change: the share of each region and when it
// expires (null: never).
type OverrideValue struct {
	Shares    map[string]float64 `json:"shares"`
	ExpiresAt *time.Time         `json:"expires_at"`
}

func overrideValueOf(o Override) *OverrideValue {
	v := &OverrideValue{Shares: maps.Clone(o.Shares)}
	if !o.ExpiresAt.IsZero() {
		t := o.ExpiresAt.UTC()
		v.ExpiresAt = &t
	}
	return v
}

func (*OverrideValue) changeValue() {}

func (v *OverrideValue) String() string {
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(v.Shares)) {
		parts = append(parts, fmt.Sprintf("%s=%g", r, v.Shares[r]))
	}
	s := strings.Join(parts, " ")
	if v.ExpiresAt != nil {
		s += ", expires " + v.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return s
}

// KeyValue is an API key in a Change (never its secret); a revoked key's New has Revoked.
type KeyValue struct {
	Tenant  string `json:"tenant"`
	Label   string `json:"label"`
	Revoked bool   `json:"revoked"`
}

func keyValueOf(k KeySpec) *KeyValue { return &KeyValue{Tenant: k.Tenant, Label: k.Label} }

func (*KeyValue) changeValue() {}

func (v *KeyValue) String() string {
	if v.Revoked {
		return "revoked"
	}
	if v.Label == "" {
		return "tenant " + v.Tenant
	}
	return fmt.Sprintf("tenant %s, label %q", v.Tenant, v.Label)
}

// TenantPlanValue is a tenant's plan in a Change.
type TenantPlanValue struct {
	Plan string `json:"plan"`
}

func (*TenantPlanValue) changeValue() {}

func (v *TenantPlanValue) String() string { return "plan " + v.Plan }
