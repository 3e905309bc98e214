package store

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/days"
	"github.com/quotaplane/quotaplane/regions"
)

// A band is written NAME=CAPACITY/PER (hour=10000/1h: 10000 tokens refilled over an
// hour, RefillPerSecond = capacity / per) or NAME=CAPACITY@REFILL (hour=10000@2.5: a
// refill per second), in ratectl's flags and tables; a limits file has the same fields
// (per or refill_per_second). PER is a Go duration, or whole days and weeks first
// (30d, 2w, 1d12h), as ratectl's duration flags.

// ParseBand reads NAME=CAPACITY/PER or NAME=CAPACITY@REFILL[/s]. It checks the syntax and the
// numbers' form; regions.Rule.Validate checks the rest (the name, the ranges, duplicates).
func ParseBand(s string) (regions.Band, error) {
	name, spec, ok := strings.Cut(s, "=")
	if !ok || name == "" || spec == "" {
		return regions.Band{}, fmt.Errorf("%w band %q: want NAME=CAPACITY/PER (hour=10000/1h) or NAME=CAPACITY@REFILL_PER_SECOND", regions.ErrInvalid, s)
	}
	b := regions.Band{Name: name}
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
			return regions.Band{}, fmt.Errorf("%w band %q: want NAME=CAPACITY/PER (hour=10000/1h) or NAME=CAPACITY@REFILL_PER_SECOND", regions.ErrInvalid, s)
		}
	}
	c, err := strconv.ParseInt(capText, 10, 64)
	if err != nil {
		return regions.Band{}, fmt.Errorf("%w band %s: capacity %q: want a whole number of tokens", regions.ErrInvalid, name, capText)
	}
	b.Capacity = c
	if isPer {
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

// FormatBand is b as ParseBand reads it: NAME=CAPACITY/PER where a per gives its refill
// exactly, else NAME=CAPACITY@REFILL.
func FormatBand(b regions.Band) string {
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
