package cliflag

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Duration is every duration flag of every binary (ratectl's --since, --ttl, --timeout;
// the rebalancer's --interval, --check-interval, ...): Go durations (90m, 36h) plus whole
// days and weeks (7d, 2w, 1d12h), one syntax everywhere. Negative values are refused.
// It is a pflag.Value over a time.Duration: (*Duration)(&d).
type Duration time.Duration

// String is FormatDuration, but "0" for zero: pflag leaves a zero default out of --help
// (where 0 usually means "the default computed from other flags" or "never").
func (d *Duration) String() string {
	if *d == 0 {
		return "0"
	}
	return FormatDuration(time.Duration(*d))
}

// Type is what --help shows after the flag's name.
func (d *Duration) Type() string { return "duration" }

// Set parses s with ParseDuration.
func (d *Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// DurationVar defines a Duration flag on fs, stored in p, with default value.
func DurationVar(fs *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*Duration)(p), name, usage)
}

// ParseDuration reads "7d", "2w", "1d12h" or any time.ParseDuration string; the days
// and weeks come first, as written.
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	if strings.TrimSpace(s) == "" {
		return 0, fmt.Errorf("empty duration: want one like 7d, 2w, 36h or 90m")
	}
	var total time.Duration
	for _, unit := range []struct {
		suffix string
		d      time.Duration
	}{{"w", 7 * 24 * time.Hour}, {"d", 24 * time.Hour}} {
		i := strings.Index(s, unit.suffix)
		if i < 0 {
			continue
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 100000 {
			return 0, fmt.Errorf("%q: want a duration like 7d, 2w, 36h or 90m", orig)
		}
		total += time.Duration(n) * unit.d
		s = s[i+1:]
	}
	if s != "" {
		rest, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return 0, fmt.Errorf("%q: want a duration like 7d, 2w, 36h or 90m", orig)
		case rest < 0:
			return 0, fmt.Errorf("%q: must not be negative", orig)
		}
		total += rest
	}
	if total < 0 {
		return 0, fmt.Errorf("%q: must not be negative", orig)
	}
	return total, nil
}

// FormatDuration prints whole days as "7d" and anything else as time.Duration does.
func FormatDuration(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}
