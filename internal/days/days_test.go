package days

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
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
			got, err := Parse(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("Parse(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                  "0s",
		7 * 24 * time.Hour: "7d",
		36 * time.Hour:     "36h0m0s",
		90 * time.Second:   "1m30s",
	} {
		if got := Format(d); got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
	}
}
