package main

import (
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	noEnv := func(string) string { return "" }
	withDB := func(k string) string {
		if k == "RATELIMIT_DATABASE_URL" {
			return "postgres://gw@127.0.0.1:5432/q"
		}
		return ""
	}
	tests := []struct {
		name    string
		args    []string
		getenv  func(string) string
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
