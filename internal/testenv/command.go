package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
)

// Command describes a program of our own (a gateway, the rebalancer) to run like the
// servers: in its own directory, logging to a file, tied to this process's life.
type Command struct {
	Name string   // also the log file's name
	Path string   // the binary
	Args []string // its arguments
	Env  []string // extra environment, KEY=VALUE
	// Dir is its working directory and where its log goes; empty means a new temporary one.
	Dir string
	// Host and Port are where it listens; Ready is polled until it returns nil.
	Host  string
	Port  int
	Ready func(ctx context.Context) error
}

// StartCommand starts c and waits until c.Ready succeeds.
func StartCommand(ctx context.Context, c Command) (*Process, error) {
	if c.Ready == nil {
		return nil, fmt.Errorf("start %s: no readiness check", c.Name)
	}
	if c.Dir == "" {
		d, err := os.MkdirTemp("", "quotaplane-"+c.Name+"-*")
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", c.Name, err)
		}
		c.Dir = d
	}
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	p := &Process{Name: c.Name, Host: c.Host, Port: c.Port, Dir: c.Dir, bin: c.Path, args: c.Args, env: c.Env, ready: c.Ready}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// HTTPReady is a readiness check: GET url answers 200.
func HTTPReady(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error { return httpOK(ctx, http.MethodGet, url) }
}
