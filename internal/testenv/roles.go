package testenv

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// CreateLoginRole creates (or reuses) the login role name on the server of dbURL, a
// member of group (one of the NOLOGIN roles the migrations create, e.g.
// "quotaplane_gateway"), and returns dbURL with name as its user and no password: the
// servers StartPostgres runs trust loopback connections. dbURL's user must be allowed to
// create roles. Roles belong to the whole server: give each database its own names.
func CreateLoginRole(ctx context.Context, dbURL, name, group string) (string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return "", fmt.Errorf("create login role %s: %w", name, err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, name).Scan(&exists); err != nil {
		return "", fmt.Errorf("create login role %s: %w", name, err)
	}
	id := pgx.Identifier{name}.Sanitize()
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE ROLE "+id+" LOGIN"); err != nil {
			return "", fmt.Errorf("create login role %s: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, "GRANT "+pgx.Identifier{group}.Sanitize()+" TO "+id); err != nil {
		return "", fmt.Errorf("grant %s to %s: %w", group, name, err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("create login role %s: %w", name, err)
	}
	u.User = url.User(name)
	return u.String(), nil
}

// LoginRole is CreateLoginRole for one test: the role is named after dbURL's database and
// suffix (so parallel tests never share one) and dropped at cleanup. dbURL's database
// must be migrated (the group roles exist).
func LoginRole(t testing.TB, dbURL, group, suffix string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testenv.LoginRole: %v", err)
	}
	name := strings.TrimPrefix(u.Path, "/") + "_" + suffix
	ctx := context.Background()
	roleURL, err := CreateLoginRole(ctx, dbURL, name, group)
	if err != nil {
		t.Fatalf("testenv.LoginRole: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	return roleURL
}
