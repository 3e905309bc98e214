// Package days owns the one duration syntax of every binary and file: Go durations
// (90m, 36h) plus whole days and weeks (7d, 2w, 1d12h): flags (internal/cliflag) and a
// band's per in limits files and the gateway's config (regions/store).
package days

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxDays bounds the days (and the weeks) of one duration.
const MaxDays = 100000

// Parse reads "7d", "2w", "1d12h" or any time.ParseDuration string; the days
// and weeks come first, as written.
func Parse(s string) (time.Duration, error) {
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
		if err != nil || n < 0 || n > MaxDays {
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

// Format prints whole days as "7d" and anything else as time.Duration does.
func Format(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}
