package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// AuditEntry is one recorded change of a rule, key or region (audit_log): who, when, why,
// and the row before and after (JSON objects; nil for an insert's old or a delete's new).
// Key hashes are never recorded.
type AuditEntry struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Actor  string          `json:"actor"`
	Reason string          `json:"reason"`
	Object string          `json:"object"` // rate_limit_rule, api_key, region
	Action string          `json:"action"` // insert, update, delete
	Old    json.RawMessage `json:"old"`
	New    json.RawMessage `json:"new"`
}

// AuditFilter selects audit entries; the zero value is every entry.
type AuditFilter struct {
	Since time.Time // zero: from the start
	Actor string    // "": any
	Limit int       // <= 0: no limit
}

// Audit lists audit entries newest first.
func (s *Store) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	limit := int64(f.Limit)
	if limit <= 0 {
		limit = -1
	}
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	rows, _ := s.pool.Query(ctx, `SELECT id, at, actor, reason, object, action, old, new FROM audit_log
		WHERE ($1::timestamptz IS NULL OR at >= $1) AND ($2 = '' OR actor = $2)
		ORDER BY at DESC, id DESC
		LIMIT CASE WHEN $3::bigint < 0 THEN NULL ELSE $3::bigint END`, since, f.Actor, limit)
	es, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var (
			e        AuditEntry
			old, new []byte
		)
		err := row.Scan(&e.ID, &e.At, &e.Actor, &e.Reason, &e.Object, &e.Action, &old, &new)
		e.Old, e.New = json.RawMessage(old), json.RawMessage(new)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return es, nil
}
