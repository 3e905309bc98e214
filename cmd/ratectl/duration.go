package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// durationValue is every duration flag of ratectl (--since, --ttl, --timeout, --window,
// --interval): Go durations (90m, 36h) plus whole days and weeks (7d, 2w, 1d12h), one
// syntax everywhere. Negative values are refused.
type durationValue time.Duration

func (d *durationValue) String() string { return formatDays(time.Duration(*d)) }
func (d *durationValue) Type() string   { return "duration" }

func (d *durationValue) Set(s string) error {
	v, err := parseDays(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

// parseDays reads "7d", "2w", "1d12h" or any time.ParseDuration string.
func parseDays(s string) (time.Duration, error) {
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

// formatDays prints whole days as "7d" and anything else as time.Duration does.
func formatDays(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}
