package migrations

import (
	"testing"

	"github.com/pressly/goose/v3"
)

// TestDownChecksCover: every embedded migration says what rolling it back loses, so a
// new migration cannot be rolled back unchecked (PlanDown refuses one without checks).
func TestDownChecksCover(t *testing.T) {
	entries, err := FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		v, err := goose.NumericComponent(e.Name())
		if err != nil {
			continue
		}
		n++
		if _, ok := downChecks[v]; !ok {
			t.Errorf("migration %s has no entry in downChecks (down.go): say what its roll back drops", e.Name())
		}
	}
	if n == 0 || int64(n) != Latest() {
		t.Errorf("%d migrations embedded, latest %d", n, Latest())
	}
}
