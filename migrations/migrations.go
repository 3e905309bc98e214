package migrations

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the SQL migrations, named NNNNN_what.sql, in goose's format.
//
//go:embed *.sql
var FS embed.FS

// NotifyChannel is the one channel the schema's triggers NOTIFY on every change of rules,
// keys, regions and shares (never on gateway heartbeats). The payload is the table name.
const NotifyChannel = "ratelimit_config"

// The transaction-local settings that name who made a change, why, and (for shares) the
// inputs behind it. The history and audit triggers read them; set them with
// set_config(name, value, true) inside the writing transaction.
const (
	SettingActor  = "quotaplane.actor"
	SettingReason = "quotaplane.reason"
	SettingInputs = "quotaplane.inputs" // JSON text, stored as jsonb in region_share_history
	// SettingOnBehalfOf names who a tool writes for (ratectl --actor). Since migration
	// 00009 the actor of audit and history rows is the connected role (session_user) and
	// this, or else SettingActor, is kept beside it as on_behalf_of; only the schema's
	// owner or a superuser may still name the actor itself.
	SettingOnBehalfOf = "quotaplane.on_behalf_of"
)

// The group roles migration 00009 creates (NOLOGIN; each component's login role is a
// member of one). docs/SECURITY.md says what each may do.
const (
	RoleGateway    = "quotaplane_gateway"
	RoleRebalancer = "quotaplane_rebalancer"
	RoleOperator   = "quotaplane_operator"
)

// ReservedIDs are the tenant and route ids the CHECKs refuse besides the syntax
// (migration 00004): regions.ValidateID refuses the same ones.
var ReservedIDs = []string{"_other"}

// lockID is the session advisory lock held while migrating, so concurrent migrators queue.
// Other packages taking advisory locks must use other ids.
const lockID int64 = 0x5170_6d67 // "Qpmg"

// MigrationStatus is one migration and whether it has been applied.
type MigrationStatus struct {
	Version   int64
	Name      string // file name, e.g. "00001_schema.sql"
	Applied   bool
	AppliedAt time.Time // zero when pending
}

// MarshalJSON writes the status as `ratectl migrate status -o json` prints it (a public
// contract): version, name, applied, and applied_at in UTC, null while pending.
func (m MigrationStatus) MarshalJSON() ([]byte, error) {
	var at *time.Time
	if !m.AppliedAt.IsZero() {
		t := m.AppliedAt.UTC()
		at = &t
	}
	return json.Marshal(struct {
		Version   int64      `json:"version"`
		Name      string     `json:"name"`
		Applied   bool       `json:"applied"`
		AppliedAt *time.Time `json:"applied_at"`
	}{m.Version, m.Name, m.Applied, at})
}

// Up applies every pending migration. Applying an up-to-date database does nothing.
// db is not closed.
func Up(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// UpTo applies the pending migrations up to and including version (tests of a
// migration over existing data use it).
func UpTo(ctx context.Context, db *sql.DB, version int64) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		return fmt.Errorf("migrate up to %d: %w", version, err)
	}
	return nil
}

// Down rolls back the most recently applied migration (one step), whatever it drops: tests
// and tools that have checked already use it; operators go through DownChecked, which
// refuses while gateways are live or data or protections would be lost. With nothing
// applied it returns an error wrapping goose.ErrNoNextVersion.
func Down(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Down(ctx); err != nil {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// DownAll rolls back every applied migration, dropping the whole schema and its data.
func DownAll(ctx context.Context, db *sql.DB) error {
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate down to 0: %w", err)
	}
	return nil
}

// Version is the version of the latest applied migration (0 for an empty database).
func Version(ctx context.Context, db *sql.DB) (int64, error) {
	p, err := provider(db)
	if err != nil {
		return 0, err
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("migration version: %w", err)
	}
	return v, nil
}

// Latest is the version of the newest embedded migration.
func Latest() int64 {
	var v int64
	entries, _ := FS.ReadDir(".")
	for _, e := range entries {
		if n, err := goose.NumericComponent(e.Name()); err == nil && n > v {
			v = n
		}
	}
	return v
}

// Status lists every embedded migration, oldest first, with whether it is applied.
func Status(ctx context.Context, db *sql.DB) ([]MigrationStatus, error) {
	p, err := provider(db)
	if err != nil {
		return nil, err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]MigrationStatus, 0, len(st))
	for _, s := range st {
		out = append(out, MigrationStatus{
			Version:   s.Source.Version,
			Name:      path.Base(s.Source.Path),
			Applied:   s.State == goose.StateApplied,
			AppliedAt: s.AppliedAt,
		})
	}
	return out, nil
}

func provider(db *sql.DB) (*goose.Provider, error) {
	if db == nil {
		return nil, errors.New("migrations: nil *sql.DB")
	}
	// Wait up to 60 s (1 s probes) for another process's migration to finish.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 60), lock.WithUnlockTimeout(1, 10))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	// p.Close would close db, which belongs to the caller; the provider holds nothing else.
	return p, nil
}
