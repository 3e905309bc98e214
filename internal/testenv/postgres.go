package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// Postgres is a PostgreSQL server started by StartPostgres, with trust authentication for
// the superuser "postgres" on 127.0.0.1 only.
type Postgres struct {
	*Process
}

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// Port to listen on; 0 picks a free one.
	Port int
	// Args are extra server arguments, for example "-c", "ssl=on" (see StartPostgresTLS).
	Args []string
}

// StartPostgres runs initdb in a new temporary directory and starts postgres on it, tuned
// for throwaway data (no fsync). When running as root it runs the server as the
// "postgres" OS user, because PostgreSQL refuses to run as root. Call Remove after Stop to
// delete the data directory.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	const pkg = "postgresql"
	dirs := []string{"/usr/lib/postgresql/*/bin"}
	initdb, err := lookBinary("initdb", pkg, dirs...)
	if err != nil {
		return nil, err
	}
	bin, err := lookBinary("postgres", pkg, dirs...)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quotaplane-pg-*")
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = postgresCredential(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("start postgres: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	cmd := exec.CommandContext(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	p := &Postgres{Process: &Process{Name: "postgres", Host: "127.0.0.1", Port: opts.Port, Dir: dir, bin: bin, cred: cred, stopSig: syscall.SIGINT}}
	p.args = []string{
		"-D", data, "-p", strconv.Itoa(opts.Port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=64MB",
	}
	p.args = append(p.args, opts.Args...)
	p.ready = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
	if err := p.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// URL is the connection URL of database db on this server.
func (p *Postgres) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: p.Addr(), Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// CreateDatabase creates an empty database and returns its URL.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return p.URL(name), nil
}

// Remove deletes the data directory; call it after Stop.
func (p *Postgres) Remove() error { return os.RemoveAll(p.Dir) }

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs the OS user postgres (install the Debian package postgresql): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
