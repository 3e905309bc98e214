package main

import (
	"context"
	"encoding/json"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

// auditObjects names audit_log's tables as the CLI does.
var auditObjects = map[string]string{"rate_limit_rule": "rule", "api_key": "key", "region": "region"}

// auditFieldNames renames the database's columns in old and new to the CLI's names.
// `ratectl audit -o json` prints store.AuditEntry values with the CLI's names: Object is
// rule, key, region or override, and Old and New carry the field names every other
// command uses (tenant, route, region). For an override, ID is the region_share_history
// id.
var auditFieldNames = map[string]map[string]string{
	"rule":   {"tenant_id": "tenant", "route_id": "route"},
	"key":    {"tenant_id": "tenant"},
	"region": {"name": "region"},
	// The plans' tables keep their names as objects (plan, plan_rule, tenant_plan).
	"plan":        {"name": "plan"},
	"plan_rule":   {"route_id": "route"},
	"tenant_plan": {"tenant_id": "tenant"},
}

// cliRow is m with its fields renamed for object (auditFieldNames); m itself when it is
// not a JSON object.
func cliRow(object string, m json.RawMessage) json.RawMessage {
	names := auditFieldNames[object]
	var row map[string]json.RawMessage
	if len(names) == 0 || len(m) == 0 || json.Unmarshal(m, &row) != nil || row == nil {
		return nullJSON(m)
	}
	for from, to := range names {
		if v, ok := row[from]; ok {
			delete(row, from)
			row[to] = v
		}
	}
	// A rule without bands (00012's "[]") reads as before bands: no field.
	if v, ok := row["bands"]; ok && (object == "rule" || object == "plan_rule") && string(v) == "[]" {
		delete(row, "bands")
	}
	b, err := json.Marshal(row)
	if err != nil {
		return nullJSON(m)
	}
	return b
}

// overrideRow is an override's side of an audit entry.
type overrideRow struct {
	Tenant    string     `json:"tenant"`
	Route     string     `json:"route"`
	Region    string     `json:"region"`
	Share     float64    `json:"share"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// overrideEntries are the operator's override changes (region_share_history rows of source
// override, written by shares set/clear and apply -f) as audit entries: the audit log's
// triggers cover rules, keys and regions only.
func overrideEntries(hs []store.HistoryEntry) []store.AuditEntry {
	var out []store.AuditEntry
	for _, h := range hs {
		if h.Source != regions.SourceOverride {
			continue
		}
		side := func(v *float64) json.RawMessage {
			if v == nil {
				return json.RawMessage("null")
			}
			r := overrideRow{Tenant: h.Scope.Tenant, Route: h.Scope.Route, Region: h.Region, Share: *v}
			if !h.ExpiresAt.IsZero() {
				t := h.ExpiresAt.UTC()
				r.ExpiresAt = &t
			}
			b, _ := json.Marshal(r) // plain fields: cannot fail
			return b
		}
		action := "update"
		switch {
		case h.Old == nil:
			action = "insert"
		case h.New == nil:
			action = "delete"
		}
		out = append(out, store.AuditEntry{ID: h.ID, At: h.At.UTC(), Actor: h.Actor, Reason: h.Reason, Object: "override", Action: action, Old: side(h.Old), New: side(h.New)})
	}
	return out
}

func newAuditCmd(a *app) *cobra.Command {
	var (
		since time.Duration
		actor string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "audit [--since 7d] [--by ACTOR] [-o json]",
		Short: "Who changed which rule, plan, key, region or override, when and why (every share change: ratectl shares history)",
		Args:  noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return usagef("--limit %d: must be > 0", limit)
			}
			f := store.AuditFilter{Actor: actor, Limit: limit}
			if since > 0 {
				f.Since = a.now().Add(-since)
			}
			return a.withStore(cmd, func(ctx context.Context, st *store.Store) error {
				es, err := st.Audit(ctx, f)
				if err != nil {
					return err
				}
				// History has no actor filter: it is applied here, over at most limit
				// entries of each kind, which is all the merged list keeps.
				hs, err := st.History(ctx, store.HistoryFilter{Since: f.Since, Limit: historyLimit(limit, actor)})
				if err != nil {
					return err
				}
				out := []store.AuditEntry{}
				for _, e := range es {
					obj := auditObjects[e.Object]
					if obj == "" {
						obj = e.Object
					}
					e.At, e.Object, e.Old, e.New = e.At.UTC(), obj, cliRow(obj, e.Old), cliRow(obj, e.New)
					out = append(out, e)
				}
				for _, e := range overrideEntries(hs) {
					if actor == "" || e.Actor == actor {
						out = append(out, e)
					}
				}
				sort.SliceStable(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
				if len(out) > limit {
					out = out[:limit]
				}
				return a.render(cmd, out, func(w io.Writer) {
					row(w, "AT", "ACTOR", "ACTION", "OBJECT", "ID", "REASON", "CHANGE")
					for _, e := range out {
						row(w, timeCell(e.At), e.Actor, e.Action, e.Object, auditID(e), orDash(oneLineText(e.Reason)), auditDelta(e))
					}
				})
			})
		}),
	}
	since = 7 * 24 * time.Hour
	f := cmd.Flags()
	f.Var((*durationValue)(&since), "since", "only changes this recent: 7d, 2w, 36h (0: all)")
	f.StringVar(&actor, "by", "", "only changes by this actor")
	f.IntVar(&limit, "limit", 200, "at most this many entries, newest first")
	return cmd
}

// historyLimit is how many share history rows audit reads: limit, or with an actor
// filter applied afterwards (the rebalancer writes most rows) a wider window.
func historyLimit(limit int, actor string) int {
	if actor != "" {
		return max(limit*10, 1000)
	}
	return limit
}

func nullJSON(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func oneLineText(s string) string { return strings.Join(strings.Fields(s), " ") }

// auditRow is the columns of an audited row that the table shows.
type auditRow struct {
	Name     string         `json:"region"`
	Plan     string         `json:"plan"`
	Tenant   string         `json:"tenant"`
	Route    string         `json:"route"`
	Capacity *int64         `json:"capacity"`
	Refill   *float64       `json:"refill_per_second"`
	Shadow   *bool          `json:"shadow"`
	Shards   *int           `json:"shards"`
	ID       *int64         `json:"id"`
	Label    string         `json:"label"`
	Revoked  *string        `json:"revoked_at"`
	Share    float64        `json:"share"`
	Bands    []regions.Band `json:"bands"`
}

func parseAuditRow(m json.RawMessage) (auditRow, bool) {
	var r auditRow
	if len(m) == 0 || string(m) == "null" {
		return r, false
	}
	return r, json.Unmarshal(m, &r) == nil
}

func auditID(e store.AuditEntry) string {
	r, ok := parseAuditRow(e.New)
	if !ok {
		r, _ = parseAuditRow(e.Old)
	}
	switch e.Object {
	case "rule":
		return r.Tenant + "/" + r.Route
	case "plan":
		return r.Plan
	case "plan_rule":
		return r.Plan + "/" + r.Route
	case "tenant_plan":
		return r.Tenant
	case "region":
		return r.Name
	case "override":
		return r.Tenant + "/" + r.Route + " " + r.Name
	case "key":
		if r.ID != nil {
			return "key " + itoa64(*r.ID) + " (" + r.Tenant + ")"
		}
	}
	return "-"
}

// auditDelta describes the change in one cell: a rule's numbers before and after, a key
// revoked.
func auditDelta(e store.AuditEntry) string {
	o, hasOld := parseAuditRow(e.Old)
	n, hasNew := parseAuditRow(e.New)
	switch e.Object {
	case "tenant_plan":
		if d := changed(hasOld, hasNew, o, n, func(r auditRow) string { return "plan " + r.Plan }); d != "" {
			return d
		}
	case "rule", "plan_rule":
		desc := func(r auditRow) string {
			if r.Capacity == nil || r.Refill == nil {
				return "?"
			}
			s := "capacity " + itoa64(*r.Capacity) + ", refill " + rateCell(*r.Refill) + "/s"
			if r.Shadow != nil && *r.Shadow {
				s += ", shadow"
			}
			if r.Shards != nil && *r.Shards != 1 {
				s += ", shards " + itoa64(int64(*r.Shards))
			}
			if len(r.Bands) > 0 {
				s += ", bands " + store.FormatBands(r.Bands)
			}
			return s
		}
		if d := changed(hasOld, hasNew, o, n, desc); d != "" {
			return d
		}
	case "override":
		desc := func(r auditRow) string { return "share " + shareCell(r.Share) }
		if d := changed(hasOld, hasNew, o, n, desc); d != "" {
			return d
		}
	case "key":
		if hasOld && hasNew && o.Revoked == nil && n.Revoked != nil {
			return "revoked"
		}
		if hasNew && n.Label != "" {
			return "label " + n.Label
		}
	}
	return "-"
}

func itoa64(v int64) string { return strconv.FormatInt(v, 10) }

// changed words a row's change from its old and new states: "old -> new", "new", or
// "was old"; "" with neither.
func changed(hasOld, hasNew bool, o, n auditRow, desc func(auditRow) string) string {
	switch {
	case hasOld && hasNew:
		return desc(o) + " -> " + desc(n)
	case hasNew:
		return desc(n)
	case hasOld:
		return "was " + desc(o)
	}
	return ""
}
