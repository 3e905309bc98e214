package main

import (
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/regions/store"
)

// auditObjects names audit_log's tables as the CLI does.
var auditObjects = map[string]string{"rate_limit_rule": "rule", "api_key": "key", "region": "region"}

// auditJSON is one entry of `ratectl audit -o json`.
type auditJSON struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Actor  string          `json:"actor"`
	Reason string          `json:"reason"`
	Object string          `json:"object"` // rule, key, region
	Action string          `json:"action"` // insert, update, delete
	Old    json.RawMessage `json:"old"`
	New    json.RawMessage `json:"new"`
}

func newAuditCmd(a *app) *cobra.Command {
	var (
		since time.Duration
		actor string
		limit int
	)
	cmd := &cobra.Command{
		Use:   "audit [--since 7d] [--by ACTOR] [-o json]",
		Short: "Who changed which rule, key or region, when and why (share changes: ratectl shares history)",
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
				out := []auditJSON{}
				for _, e := range es {
					obj := auditObjects[e.Object]
					if obj == "" {
						obj = e.Object
					}
					out = append(out, auditJSON{ID: e.ID, At: e.At.UTC(), Actor: e.Actor, Reason: e.Reason, Object: obj, Action: e.Action, Old: nullJSON(e.Old), New: nullJSON(e.New)})
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

func nullJSON(m json.RawMessage) json.RawMessage {
	if len(m) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func oneLineText(s string) string { return strings.Join(strings.Fields(s), " ") }

// auditRow is the columns of an audited row that the table shows.
type auditRow struct {
	Name     string   `json:"name"`
	Tenant   string   `json:"tenant_id"`
	Route    string   `json:"route_id"`
	Capacity *int64   `json:"capacity"`
	Refill   *float64 `json:"refill_per_second"`
	Shadow   *bool    `json:"shadow"`
	Shards   *int     `json:"shards"`
	ID       *int64   `json:"id"`
	Label    string   `json:"label"`
	Revoked  *string  `json:"revoked_at"`
}

func parseAuditRow(m json.RawMessage) (auditRow, bool) {
	var r auditRow
	if len(m) == 0 || string(m) == "null" {
		return r, false
	}
	return r, json.Unmarshal(m, &r) == nil
}

func auditID(e auditJSON) string {
	r, ok := parseAuditRow(e.New)
	if !ok {
		r, _ = parseAuditRow(e.Old)
	}
	switch e.Object {
	case "rule":
		return r.Tenant + "/" + r.Route
	case "region":
		return r.Name
	case "key":
		if r.ID != nil {
			return "key " + itoa64(*r.ID) + " (" + r.Tenant + ")"
		}
	}
	return "-"
}

// auditDelta describes the change in one cell: a rule's numbers before and after, a key
// revoked.
func auditDelta(e auditJSON) string {
	o, hasOld := parseAuditRow(e.Old)
	n, hasNew := parseAuditRow(e.New)
	switch e.Object {
	case "rule":
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
			return s
		}
		switch {
		case hasOld && hasNew:
			return desc(o) + " -> " + desc(n)
		case hasNew:
			return desc(n)
		case hasOld:
			return "was " + desc(o)
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
