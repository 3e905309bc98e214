package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// RedisOptions configures StartRedis. The zero value is a plain standalone server.
type RedisOptions struct {
	// Dir is the data directory; empty means a new temporary directory that Stop does not
	// remove (tests pass t.TempDir()).
	Dir string
	// Port to listen on; 0 picks a free one.
	Port int
	// Args are extra redis-server arguments, for example "--cluster-enabled", "yes".
	Args []string
}

// StartRedis starts redis-server on 127.0.0.1 with no persistence and waits for PING.
func StartRedis(ctx context.Context, opts RedisOptions) (*Process, error) {
	bin, err := lookBinary("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "quotaplane-redis-*"); err != nil {
			return nil, fmt.Errorf("start redis: %w", err)
		}
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	p := &Process{Name: "redis", Host: "127.0.0.1", Port: opts.Port, Dir: opts.Dir, bin: bin}
	p.args = append([]string{
		"--port", strconv.Itoa(opts.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", opts.Dir,
		"--daemonize", "no", "--protected-mode", "no",
	}, opts.Args...)
	p.ready = func(ctx context.Context) error { return redisPing(ctx, p.Addr()) }
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// RedisURL is the go-redis URL of a server started by StartRedis.
func RedisURL(p *Process) string { return "redis://" + p.Addr() + "/0" }

// redisPing speaks just enough RESP to ask a server whether it serves commands.
func redisPing(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return pingConn(ctx, conn)
}

// pingConn sends PING on an open connection (plain or TLS), expects +PONG, and closes it.
func pingConn(ctx context.Context, conn net.Conn) error {
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("%w: redis answered %q", errNotReady, strings.TrimSpace(line))
	}
	return nil
}
