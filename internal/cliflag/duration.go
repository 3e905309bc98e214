package cliflag

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/quotaplane/quotaplane/internal/days"
)

// Duration is every duration flag of every binary (ratectl's --since, --ttl, --timeout;
// the rebalancer's --interval, --check-interval, ...): Go durations (90m, 36h) plus whole
// days and weeks (7d, 2w, 1d12h), one syntax everywhere. Negative values are refused.
// It is a pflag.Value over a time.Duration: (*Duration)(&d).
type Duration time.Duration

// String is days.Format, but "0" for zero: pflag leaves a zero default out of --help
// (where 0 usually means "the default computed from other flags" or "never").
func (d *Duration) String() string {
	if *d == 0 {
		return "0"
	}
	return days.Format(time.Duration(*d))
}

// Type is what --help shows after the flag's name.
func (d *Duration) Type() string { return "duration" }

// Set parses s with days.Parse.
func (d *Duration) Set(s string) error {
	v, err := days.Parse(s)
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
