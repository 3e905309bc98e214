package cliflag

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestDurationFlag: the flag takes days, shows its default in days, and pflag's error for
// a bad value names the flag and says what a duration looks like.
func TestDurationFlag(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var d time.Duration
	DurationVar(fs, &d, "interval", 2*24*time.Hour, "full run period")
	if !strings.Contains(fs.FlagUsages(), "--interval duration   full run period (default 2d)") {
		t.Errorf("usage %q: want the default in days", fs.FlagUsages())
	}
	DurationVar(fs, new(time.Duration), "ttl", 0, "expire after this long (0: never)")
	if !strings.Contains(fs.FlagUsages(), "(0: never)\n") {
		t.Errorf("usage %q: want no zero default shown", fs.FlagUsages())
	}
	if err := fs.Parse([]string{"--interval", "7d12h"}); err != nil || d != 180*time.Hour {
		t.Fatalf("--interval 7d12h: %v, %v", d, err)
	}
	err := fs.Parse([]string{"--interval", "7x"})
	if err == nil || !strings.Contains(err.Error(), `"--interval"`) || !strings.Contains(err.Error(), "want a duration like 7d") {
		t.Errorf("--interval 7x: %v, want an error naming the flag", err)
	}
}
