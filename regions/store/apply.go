package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// Apply makes the database equal to desired, section by section, in one transaction that
// first locks the four tables against writers (readers, gateways among them, go on): the
// plan is recomputed inside it, so what is written is exactly the returned plan. Every
// change is recorded with actor and reason (audit_log for regions, rules and keys,
// region_share_history for overrides). An empty plan writes nothing.
func (s *Store) Apply(ctx context.Context, desired Config, actor, reason string) ([]Change, error) {
	return s.ApplyState(ctx, desired, "", actor, reason)
}

// ApplyState is Apply of a plan made against state (PlanState): under the lock, before
// writing anything, it refuses with ErrStateChanged when the sections desired manages
// are no longer in that state, so what is written is the plan that was reviewed. An empty
// state skips the check (Apply).
func (s *Store) ApplyState(ctx context.Context, desired Config, state, actor, reason string) ([]Change, error) {
	if err := desired.Normalize(); err != nil {
		return nil, err
	}
	if actor == "" || reason == "" {
		return nil, fmt.Errorf("apply: %w: an actor and a reason are required", regions.ErrInvalid)
	}
	var changes []Change
	err := s.write(ctx, audit{actor, reason}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `LOCK TABLE `+strings.Join(desired.tables(), ", ")+` IN EXCLUSIVE MODE`); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		cur, now, err := readConfig(ctx, tx)
		if err != nil {
			return err
		}
		if got := stateOf(cur, desired); state != "" && got != state {
			return fmt.Errorf("%w (planned against %s, now %s)", ErrStateChanged, shortState(state), shortState(got))
		}
		if changes, err = plan(cur, desired, now); err != nil {
			return err
		}
		return applyChanges(ctx, tx, changes)
	})
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	return changes, nil
}

// tables are the tables Apply(c) locks against writers while it plans and writes: those
// of the sections c manages, and region for any of them that reads the region set (the
// overrides' shares name every region). A rules-only file leaves keys and shares free.
func (c Config) tables() []string {
	var ts []string
	if c.Regions != nil || c.Overrides != nil {
		ts = append(ts, "region", "region_share")
	}
	if c.Rules != nil {
		ts = append(ts, "rate_limit_rule")
	}
	if c.Keys != nil {
		ts = append(ts, "api_key")
	}
	if c.Plans != nil || c.TenantPlans != nil {
		// Each reads the other (a plan in use, an assignment's plan).
		ts = append(ts, "plan", "plan_rule", "tenant_plan")
	}
	if len(ts) == 0 {
		ts = []string{"region"} // nothing managed: the plan is empty; lock the least
	}
	return ts
}

// applyChanges writes changes in order. The rule changes, however many (a file of 100,000
// rules), are written together at the place of the first: one DELETE and one
// INSERT ... ON CONFLICT of arrays, not a statement per rule.
func applyChanges(ctx context.Context, tx pgx.Tx, changes []Change) error {
	rulesDone := false
	for _, c := range changes {
		if c.Object == "rule" {
			if !rulesDone {
				if err := applyRuleChanges(ctx, tx, changes); err != nil {
					return fmt.Errorf("rules: %w", dbErr(err))
				}
				rulesDone = true
			}
			continue
		}
		if err := c.apply(ctx, tx); err != nil {
			return fmt.Errorf("%s %s %s: %w", c.Action, c.Object, c.ID, dbErr(err))
		}
	}
	return nil
}

// applyRuleChanges writes every rule change of changes in two statements: the deletes,
// then the adds and changes as one upsert.
func applyRuleChanges(ctx context.Context, tx pgx.Tx, changes []Change) error {
	var deletes, writes ruleRows
	for _, c := range changes {
		if c.Object != "rule" {
			continue
		}
		if c.Action == ActionDelete {
			deletes.add(c.rule)
			continue
		}
		writes.add(c.rule)
	}
	if deletes.len() > 0 {
		if _, err := deletes.delete(ctx, tx); err != nil {
			return fmt.Errorf("delete %d: %w", deletes.len(), err)
		}
	}
	if writes.len() > 0 {
		if err := writes.upsert(ctx, tx); err != nil {
			return fmt.Errorf("write %d: %w", writes.len(), err)
		}
	}
	return nil
}
