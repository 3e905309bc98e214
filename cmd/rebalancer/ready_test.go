package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/regions/store"
)

// TestReadyz: the rebalancer is ready only once its database answers and holds a region
// row; a dead database and an empty one are both "not ready", with the reason.
func TestReadyz(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresDB(t)
	st, err := store.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadDB := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	for _, tc := range []struct {
		name, db, want string
		addRegion      bool
	}{
		{name: "database down", db: deadDB, want: "503 database not reachable\n"},
		{name: "no regions", db: dbURL, want: "503 no region rows: add regions with ratectl\n"},
		{name: "a region", db: dbURL, addRegion: true, want: "200 ready\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.addRegion {
				if err := st.AddRegion(t.Context(), "us-east"); err != nil {
					t.Fatal(err)
				}
			}
			port, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"--database-url", tc.db, "--prometheus-url", "http://127.0.0.1:1",
					"--admin-listen", addr, "--dry-run", "--log-level", "error"}, noEnv, io.Discard)
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			var got string
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				res, err := http.Get("http://" + addr + "/readyz")
				if err == nil {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					got = fmt.Sprintf("%d %s", res.StatusCode, b)
					if got == tc.want {
						return
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Fatalf("/readyz = %q, want %q", got, tc.want)
		})
	}
}
