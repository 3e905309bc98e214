package store

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/quotaplane/quotaplane/internal/days"
	"github.com/quotaplane/quotaplane/regions"
)

// A band is written NAME=CAPACITY/PER (hour=10000/1h: 10000 tokens refilled over an
// hour, RefillPerSecond = capacity / per) or NAME=CAPACITY@REFILL (hour=10000@2.5: a
// refill per second), in ratectl's flags and tables; a limits file has the same fields
// (per or refill_per_second). PER is a Go duration, or whole days and weeks first
// (30d, 2w, 1d12h), as ratectl's duration flags.
//
// A calendar quota is written NAME=AMOUNT/PERIOD or NAME=AMOUNT/PERIOD@ZONE, PERIOD one
// of the words hour, day, week, month (month=1000000/month, day=5000/day@Europe/Berlin):
// AMOUNT per calendar period in ZONE (UTC without one). A word is a quota and a duration
// a token bucket: day=5000/day resets at midnight, day=5000/1d refills smoothly.

const bandSyntax = "want NAME=CAPACITY/PER (hour=10000/1h), NAME=CAPACITY@REFILL_PER_SECOND or a calendar quota NAME=AMOUNT/PERIOD[@ZONE] (month=1000000/month)"

// ParseBand reads NAME=CAPACITY/PER, NAME=CAPACITY@REFILL[/s] or NAME=AMOUNT/PERIOD[@ZONE].
// It checks the syntax and the numbers' form; regions.Rule.Validate checks the rest
// (the name, the ranges, the zone, duplicates).
func ParseBand(s string) (regions.Band, error) {
	name, spec, ok := strings.Cut(s, "=")
	if !ok || name == "" || spec == "" {
		return regions.Band{}, fmt.Errorf("%w band %q: %s", regions.ErrInvalid, s, bandSyntax)
	}
	b := regions.Band{Name: name}
	// AMOUNT/PERIOD[@ZONE] first: a zone holds '/' and a refill may end in "/s".
	if amount, rest, ok := strings.Cut(spec, "/"); ok {
		word, zone, zoned := strings.Cut(rest, "@")
		if period, ok := ParsePeriod(word); ok || zoned {
			if !ok {
				return regions.Band{}, fmt.Errorf("%w band %s: %w", regions.ErrInvalid, name, periodError(word))
			}
			if zoned && zone == "" {
				return regions.Band{}, fmt.Errorf("%w band %s: zone after '@' is empty: give an IANA time zone like Europe/Berlin, or no '@' for UTC", regions.ErrInvalid, name)
			}
			c, err := strconv.ParseInt(amount, 10, 64)
			if err != nil {
				return regions.Band{}, fmt.Errorf("%w band %s: amount %q: want a whole number per %s", regions.ErrInvalid, name, amount, period)
			}
			b.Capacity, b.Period, b.Zone = c, period, zone
			return b, nil
		}
	}
	// CAPACITY@REFILL (a trailing "/s" allowed: 500@10/s), else CAPACITY/PER.
	capText, refill, isRefill := strings.Cut(spec, "@")
	refill = strings.TrimSuffix(refill, "/s")
	var (
		per   string
		isPer bool
	)
	if !isRefill {
		capText, per, isPer = strings.Cut(spec, "/")
		if !isPer {
			return regions.Band{}, fmt.Errorf("%w band %q: %s", regions.ErrInvalid, s, bandSyntax)
		}
	}
	c, err := strconv.ParseInt(capText, 10, 64)
	if err != nil {
		return regions.Band{}, fmt.Errorf("%w band %s: capacity %q: want a whole number of tokens", regions.ErrInvalid, name, capText)
	}
	b.Capacity = c
	if isPer {
		if _, perr := parsePer(per); perr != nil && isWord(per) {
			return regions.Band{}, fmt.Errorf("%w band %s: %w", regions.ErrInvalid, name, periodError(per))
		}
		b.RefillPerSecond, err = RefillOver(c, per)
		if err != nil {
			return regions.Band{}, fmt.Errorf("%w band %s: %w", regions.ErrInvalid, name, err)
		}
		return b, nil
	}
	r, err := strconv.ParseFloat(refill, 64)
	if err != nil || math.IsNaN(r) || math.IsInf(r, 0) {
		return regions.Band{}, fmt.Errorf("%w band %s: refill %q: want tokens per second, a number", regions.ErrInvalid, name, refill)
	}
	b.RefillPerSecond = r
	return b, nil
}

// ParsePeriod reads a quota's period word: hour, day, week or month.
func ParsePeriod(s string) (regions.Period, bool) {
	p := regions.Period(s)
	return p, slices.Contains(regions.Periods, p)
}

// periodError says what is wrong with a period word that is none of regions.Periods.
func periodError(word string) error {
	return fmt.Errorf("period %q: want hour, day, week or month for a calendar quota (a duration like 1h or 30d makes a token bucket)", word)
}

// isWord reports whether s is letters only (a misspelt period, not a duration).
func isWord(s string) bool {
	for _, c := range s {
		if !unicode.IsLetter(c) {
			return false
		}
	}
	return s != ""
}

// RefillOver is the refill per second of capacity tokens over per (a duration, see
// ParseBand): capacity / per in seconds.
func RefillOver(capacity int64, per string) (float64, error) {
	d, err := parsePer(per)
	if err != nil {
		return 0, err
	}
	return float64(capacity) / d.Seconds(), nil
}

// parsePer reads a band's per: "7d", "2w", "1d12h" or a time.ParseDuration string
// (internal/days, the syntax of every duration flag), > 0.
func parsePer(s string) (time.Duration, error) {
	d, err := days.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("per %q: want a duration like 1h, 90m, 30d or 1w", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("per %q: want a duration above zero, like 1h or 30d", s)
	}
	return d, nil
}

// BandPer is the per that b is written with: a whole number of seconds from which
// RefillOver gives back b.RefillPerSecond exactly; ok false when there is none (then
// the refill is written as a number).
func BandPer(b regions.Band) (string, bool) {
	if !(b.RefillPerSecond > 0) || b.Capacity <= 0 {
		return "", false
	}
	secs := math.Round(float64(b.Capacity) / b.RefillPerSecond)
	if secs < 1 || secs > days.MaxDays*24*3600 {
		return "", false
	}
	d := time.Duration(secs) * time.Second
	if float64(b.Capacity)/d.Seconds() != b.RefillPerSecond {
		return "", false
	}
	s := formatPer(d)
	if back, err := RefillOver(b.Capacity, s); err != nil || back != b.RefillPerSecond {
		return "", false
	}
	return s, true
}

// formatPer prints whole days as "30d", anything else as time.Duration does, trimmed of
// zero units ("1h", not "1h0m0s").
func formatPer(d time.Duration) string {
	const day = 24 * time.Hour
	if d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// FormatBand is b as ParseBand reads it: a quota NAME=AMOUNT/PERIOD[@ZONE]; a token
// bucket NAME=CAPACITY/PER where a per gives its refill exactly, else
// NAME=CAPACITY@REFILL.
func FormatBand(b regions.Band) string {
	if b.Quota() {
		if b.Zone != "" {
			return fmt.Sprintf("%s=%d/%s@%s", b.Name, b.Capacity, b.Period, b.Zone)
		}
		return fmt.Sprintf("%s=%d/%s", b.Name, b.Capacity, b.Period)
	}
	if per, ok := BandPer(b); ok {
		return fmt.Sprintf("%s=%d/%s", b.Name, b.Capacity, per)
	}
	return fmt.Sprintf("%s=%d@%s", b.Name, b.Capacity, strconv.FormatFloat(b.RefillPerSecond, 'g', -1, 64))
}

// FormatBands is bs as FormatBand, comma separated; "" for none.
func FormatBands(bs []regions.Band) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = FormatBand(b)
	}
	return strings.Join(parts, ",")
}
