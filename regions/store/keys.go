package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/regions"
)

// KeyPrefix starts every API key secret, so a leaked key is recognisable (secret scanners).
const KeyPrefix = "qp_"

// maxLabel is the longest key label, in characters (the schema's limit).
const maxLabel = 200

// CreateKey makes a new API key for tenant: 256 random bits, returned once as
// KeyPrefix + base64url (no padding). Only HashKey(secret) is stored. The tenant need not
// have rules yet (see TenantExists).
func (s *Store) CreateKey(ctx context.Context, tenant, label string) (string, regions.APIKey, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key: %w", err)
	}
	if err := validateLabel(label); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	secret := KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	k := regions.APIKey{Hash: regions.HashKey(secret), Tenant: tenant, Label: label}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return dbErr(insertKey(ctx, tx, &k))
	})
	if err != nil {
		return "", regions.APIKey{}, fmt.Errorf("create key for %s: %w", tenant, err)
	}
	return secret, k, nil
}

func validateLabel(label string) error {
	if !utf8.ValidString(label) {
		return fmt.Errorf("%w label: not UTF-8", regions.ErrInvalid)
	}
	if n := utf8.RuneCountInString(label); n > maxLabel {
		return fmt.Errorf("%w label: %d characters, at most %d", regions.ErrInvalid, n, maxLabel)
	}
	for _, r := range label {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w label %q: control characters are not allowed", regions.ErrInvalid, label)
		}
	}
	return nil
}

// Keys lists the keys of tenant ("" = every tenant), revoked ones included, by id.
func (s *Store) Keys(ctx context.Context, tenant string) ([]regions.APIKey, error) {
	if tenant != "" {
		if err := regions.ValidateID("tenant", tenant); err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
	}
	rows, _ := s.pool.Query(ctx, `SELECT id, key_hash, tenant_id, label, created_at, revoked_at FROM api_key
		WHERE $1 = '' OR tenant_id = $1 ORDER BY id`, tenant)
	keys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (regions.APIKey, error) {
		var (
			k       regions.APIKey
			hash    []byte
			revoked *time.Time
		)
		if err := row.Scan(&k.ID, &hash, &k.Tenant, &k.Label, &k.CreatedAt, &revoked); err != nil {
			return regions.APIKey{}, err
		}
		copy(k.Hash[:], hash)
		if revoked != nil {
			k.RevokedAt = *revoked
		}
		return k, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes the key with id; gateways refuse it after their next reload. Revoking a
// revoked key changes nothing; ErrNotFound if there is no such key.
func (s *Store) RevokeKey(ctx context.Context, id int64) error {
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		if revoked, err := revokeKey(ctx, tx, id, nil); err != nil || revoked {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM api_key WHERE id = $1)`, id).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return ErrNotFound
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("revoke key %d: %w", id, err)
	}
	return nil
}

// ImportKey stores an API key known only by the SHA-256 of its secret, for tenant: the
// secret was made elsewhere (a secrets manager) and never reaches the database or ratectl.
// ErrExists if that hash is stored already (revoked or not).
func (s *Store) ImportKey(ctx context.Context, hash regions.KeyHash, tenant, label string) (regions.APIKey, error) {
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return regions.APIKey{}, fmt.Errorf("import key: %w", err)
	}
	if err := validateLabel(label); err != nil {
		return regions.APIKey{}, fmt.Errorf("import key for %s: %w", tenant, err)
	}
	k := regions.APIKey{Hash: hash, Tenant: tenant, Label: label}
	err := s.write(ctx, auditOf(ctx), func(tx pgx.Tx) error {
		return dbErr(insertKey(ctx, tx, &k))
	})
	if err != nil {
		return regions.APIKey{}, fmt.Errorf("import key sha256:%s for %s: %w", shortHash(hash), tenant, err)
	}
	return k, nil
}

// insertKey stores k, unrevoked, and sets its ID and CreatedAt; ErrExists if its hash is
// stored already (revoked or not). CreateKey, ImportKey and Apply share it.
func insertKey(ctx context.Context, tx pgx.Tx, k *regions.APIKey) error {
	err := tx.QueryRow(ctx, `INSERT INTO api_key (key_hash, tenant_id, label) VALUES ($1, $2, $3)
		ON CONFLICT (key_hash) DO NOTHING RETURNING id, created_at`, k.Hash[:], k.Tenant, k.Label).Scan(&k.ID, &k.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrExists
	}
	return err
}

// revokeKey revokes the key with id, or with hash (0 and nil match no key), unless it is
// revoked already, and reports whether it revoked one. RevokeKey and Apply (--prune keys)
// share it.
func revokeKey(ctx context.Context, tx pgx.Tx, id int64, hash []byte) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE api_key SET revoked_at = now() WHERE revoked_at IS NULL AND (id = $1 OR key_hash = $2)`, id, hash)
	return tag.RowsAffected() > 0, err
}
