package main

import (
	"context"
	"strings"
	"testing"
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
		{"unknown flag", []string{"--nope"}, noEnv, "flag provided but not defined: -nope"},
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
			err := run(context.Background(), tt.args, tt.getenv)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("run: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("run: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
