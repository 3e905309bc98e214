package main

import (
	"time"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/days"
)

// durationValue is every duration flag of ratectl (--since, --ttl, --timeout, --window,
// --interval): the one syntax of every binary, days and weeks included (cliflag.Duration).
type durationValue = cliflag.Duration

// parseDays reads "7d", "2w", "1d12h" or any time.ParseDuration string.
func parseDays(s string) (time.Duration, error) { return days.Parse(s) }
