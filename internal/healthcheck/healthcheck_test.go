package healthcheck

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ready\n")) })
	mux.HandleFunc("GET /notready", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("database not reachable\nsecond line\n"))
	})
	mux.HandleFunc("GET /moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/readyz", http.StatusFound) })
	mux.HandleFunc("GET /hang", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// A port nothing listens on: listen, note it, close.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() + "/readyz"
	l.Close()

	for _, tc := range []struct {
		name       string
		args       []string
		wantOut    string // "" when an error is wanted
		wantErr    string
		errHelpErr bool
	}{
		{"default url, ready", nil, srv.URL + "/readyz: 200 OK: ready", "", false},
		{"explicit url", []string{srv.URL + "/readyz"}, srv.URL + "/readyz: 200 OK: ready", "", false},
		{"not ready, first body line", []string{srv.URL + "/notready"}, "", "healthcheck: " + srv.URL + "/notready: 503 Service Unavailable: database not reachable", false},
		{"redirect is not followed", []string{srv.URL + "/moved"}, "", "302 Found", false},
		{"nothing listening", []string{closed}, "", "connection refused", false},
		{"no answer in time", []string{"--timeout", "50ms", srv.URL + "/hang"}, "", "no answer within 50ms", false},
		{"not a url", []string{"127.0.0.1:9100/readyz"}, "", `want an http:// or https:// URL with a host`, false},
		{"two urls", []string{srv.URL, srv.URL}, "", "one URL at most", false},
		{"bad timeout", []string{"--timeout", "0s"}, "", "--timeout 0s: must be > 0", false},
		{"help", []string{"--help"}, "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := Run(context.Background(), "gateway", tc.args, srv.URL+"/readyz", &out, &errOut)
			switch {
			case tc.errHelpErr:
				if !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "usage: gateway healthcheck") {
					t.Fatalf("err %v, usage %q: want flag.ErrHelp and the usage", err, errOut.String())
				}
			case tc.wantOut != "":
				if err != nil {
					t.Fatalf("err %v, want %q", err, tc.wantOut)
				}
				if got := strings.TrimSpace(out.String()); got != tc.wantOut {
					t.Fatalf("stdout %q, want %q", got, tc.wantOut)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "second line") {
					t.Errorf("err %q: more than the body's first line", err)
				}
			}
		})
	}
}

// TestCheckIgnoresProxyEnvironment: a container's HTTP_PROXY must not carry the check of
// a service name (http://gateway-us-east:9100 in compose) off to a proxy, which would
// answer for it.
func TestCheckIgnoresProxyEnvironment(t *testing.T) {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("proxied")) }))
	defer proxy.Close()
	t.Setenv("HTTP_PROXY", proxy.URL)
	t.Setenv("NO_PROXY", "")
	line, err := Check(context.Background(), "http://quotaplane-healthcheck.invalid/readyz", time.Second)
	if err == nil {
		t.Fatalf("a name that does not resolve was reported healthy: %q (through the proxy)", line)
	}
}
