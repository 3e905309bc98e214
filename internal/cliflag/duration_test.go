package cliflag

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"7d", 7 * 24 * time.Hour, false},
		{"2w", 14 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"7d12h", 180 * time.Hour, false},
		{"2w1d", 15 * 24 * time.Hour, false},
		{"90m", 90 * time.Minute, false},
		{"1m0s", time.Minute, false},
		{"0", 0, false},
		{"-1d", 0, true},
		{"-5m", 0, true},
		{"7days", 0, true},
		{"1d2w", 0, true},
		{"d", 0, true},
		{"", 0, true},
		{" ", 0, true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseDuration(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ParseDuration(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                  "0s",
		7 * 24 * time.Hour: "7d",
		36 * time.Hour:     "36h0m0s",
		90 * time.Second:   "1m30s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

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
