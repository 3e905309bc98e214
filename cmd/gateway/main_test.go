package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/gateway"
	"github.com/quotaplane/quotaplane/internal/cliflag"
)

func TestRun(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	noEnv := env()
	withDB := env("RATELIMIT_DATABASE_URL", "postgres://gw@127.0.0.1:5432/q")
	prod := "../../deploy/regions/us-east/gateway.yaml"
	tests := []struct {
		name    string
		args    []string
		getenv  func(string) (string, bool)
		wantErr string // "" means success
	}{
		{"no config", nil, noEnv, "--config FILE is required"},
		{"unknown flag", []string{"--nope"}, noEnv, "unknown flag: --nope"},
		{"one dash reads as two", []string{"-config", "x.yaml"}, noEnv, "config x.yaml: open x.yaml"},
		{"one dash, no such flag", []string{"-nope"}, noEnv, "unknown flag -nope"},
		{"bad bool", []string{"--config", "x.yaml", "--check=maybe"}, noEnv, `--check "maybe": want true or false`},
		{"extra argument", []string{"--config", "x.yaml", "serve"}, noEnv, `unexpected arguments ["serve"]`},
		{"check a good file", []string{"--config", "../../gateway/testdata/good-full.yaml", "--check"}, noEnv, ""},
		{"flags override", []string{"--config", "../../gateway/testdata/good-minimal.yaml", "--check", "--region", "ap-south", "--listen", "127.0.0.1:1"}, noEnv, ""},
		{"bad flag value", []string{"--config", "../../gateway/testdata/good-minimal.yaml", "--check", "--region", "ap south"}, noEnv,
			`config ../../gateway/testdata/good-minimal.yaml: region: region id "ap south"`},
		{"bad file", []string{"--config", "../../gateway/testdata/bad/unknown-key.yaml"}, noEnv,
			`config ../../gateway/testdata/bad/unknown-key.yaml: regoin: unknown key "regoin"`},
		{"env database turns tenants into an error", []string{"--config", "../../gateway/testdata/good-full.yaml", "--check"}, withDB,
			"tenants: only allowed without database_url"},
		{"production config", []string{"--config", prod, "--check"},
			env("RATELIMIT_DATABASE_URL", "postgres://gw@127.0.0.1:5432/q", "RATELIMIT_REDIS_URL", "redis://127.0.0.1:6379/0"), ""},
		{"production config, empty database url", []string{"--config", prod, "--check"},
			env("RATELIMIT_DATABASE_URL", "", "RATELIMIT_REDIS_URL", "redis://127.0.0.1:6379/0"),
			"database_url: RATELIMIT_DATABASE_URL is set but empty"},
		{"production config, empty redis url", []string{"--config", prod, "--check"},
			env("RATELIMIT_DATABASE_URL", "postgres://gw@127.0.0.1:5432/q", "RATELIMIT_REDIS_URL", ""),
			"redis.url: RATELIMIT_REDIS_URL is set but empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, tt.getenv, io.Discard, io.Discard)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("run: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("run: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestExitCodes: a bad command line exits 2 with one line naming the flag; a bad
// configuration file (the program ran) exits 1; --help and --version exit 0 on stdout,
// the help ending with the environment the gateway reads.
func TestExitCodes(t *testing.T) {
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stdout string // contained in stdout
		stderr string // the whole of stderr
	}{
		{name: "help", args: []string{"--help"}, stdout: "Environment (they win over the --config file's values; set but empty is refused):\n" +
			"  RATELIMIT_DATABASE_URL   database_url: the control plane's PostgreSQL\n" +
			"  RATELIMIT_REDIS_URL      redis.url: the region's Redis\n"},
		{name: "help names the flags", args: []string{"--help"}, stdout: "--config string   configuration file"},
		{name: "version flag", args: []string{"--version"}, stdout: "gateway "},
		{name: "version command", args: []string{"version"}, stdout: "\ncommit "},
		{name: "check", args: []string{"--config", "../../gateway/testdata/good-minimal.yaml", "--check"}, stdout: ": ok (mode "},
		{name: "unknown flag", args: []string{"--nope"}, code: 2, stderr: "gateway: unknown flag: --nope\n"},
		{name: "missing value", args: []string{"--config"}, code: 2, stderr: "gateway: flag needs an argument: --config\n"},
		{name: "no config", args: nil, code: 2, stderr: "gateway: --config FILE is required\n"},
		{name: "stray argument", args: []string{"serve"}, code: 2, stderr: "gateway: unexpected arguments [\"serve\"] (commands: [healthcheck version])\n"},
		{name: "bad file", args: []string{"--config", "../../gateway/testdata/bad/unknown-key.yaml"}, code: 1,
			stderr: "gateway: config ../../gateway/testdata/bad/unknown-key.yaml: regoin: unknown key \"regoin\"\n"},
		{name: "healthcheck fails", args: []string{"healthcheck", "--timeout", "1s", "http://127.0.0.1:1/readyz"}, code: 1,
			stderr: "gateway: healthcheck: http://127.0.0.1:1/readyz: dial tcp 127.0.0.1:1: connect: connection refused\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cliflag.Exit(&stderr, "gateway", run(context.Background(), tt.args, func(string) (string, bool) { return "", false }, &stdout, &stderr))
			if code != tt.code || !strings.Contains(stdout.String(), tt.stdout) || stderr.String() != tt.stderr {
				t.Errorf("exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout containing %q, stderr %q", code, stdout.String(), stderr.String(), tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestEnvNames: the gateway reads its URLs from the names every binary reads.
func TestEnvNames(t *testing.T) {
	if gateway.EnvDatabaseURL != cliflag.EnvDatabaseURL || gateway.EnvRedisURL != cliflag.EnvRedisURL {
		t.Errorf("gateway reads %s and %s, the other binaries %s and %s",
			gateway.EnvDatabaseURL, gateway.EnvRedisURL, cliflag.EnvDatabaseURL, cliflag.EnvRedisURL)
	}
}
