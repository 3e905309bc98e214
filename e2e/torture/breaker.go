package torture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// The gateway's log messages the checker reads (gateway/limiter and gateway, JSON via
// log/slog with a "time" field): its breaker leaving and reaching the closed state, and
// its process starting and stopping.
const (
	msgBreakerOpen   = "redis circuit breaker state changed; decisions from local fallback"
	msgBreakerClosed = "redis circuit breaker closed; decisions from redis again"
	msgStarting      = "gateway starting"
	msgStopped       = "gateway stopped"
)

// LogEvent is one line of a gateway's log that the breaker spans depend on.
type LogEvent struct {
	Time time.Time
	Msg  string
	// From and To are the breaker states of a state change.
	From, To string
}

// ParseBreakerLog reads a gateway's JSON log and returns, in order, its breaker state
// changes and its process starts and stops. Lines that are not JSON (a panic, go-redis's
// own output before the logger is set) and other messages are skipped; a line of ours
// without a parsable time is an error.
func ParseBreakerLog(r io.Reader) ([]LogEvent, error) {
	var out []LogEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		var l struct {
			Time, Msg, From, To string
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Msg {
		case msgBreakerOpen, msgBreakerClosed, msgStarting, msgStopped:
		default:
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil {
			return nil, fmt.Errorf("line %d (%q): time %q: %w", line, l.Msg, l.Time, err)
		}
		out = append(out, LogEvent{Time: t, Msg: l.Msg, From: l.From, To: l.To})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	return out, nil
}

// BreakerSpans turns a gateway's log events into the spans in which its breaker was open
// or half-open: from the first change away from closed to the next "closed" line. A
// process that stops (or is killed: its next start comes without a stop line) while
// open ends its span at its stop: the end of the life it ran in (lives, as the run
// recorded them), or the last line of the process where no life covers it.
func BreakerSpans(events []LogEvent, lives []Life) []Span {
	lifeEnd := func(t time.Time) (time.Time, bool) {
		for _, l := range lives {
			if !t.Before(l.From) && !t.After(l.To) {
				return l.To, true
			}
		}
		return time.Time{}, false
	}
	var out []Span
	open := false
	var from, last time.Time
	stop := func(at time.Time) {
		if !open {
			return
		}
		if end, ok := lifeEnd(from); ok {
			at = end
		}
		out = append(out, Span{From: from, To: at})
		open = false
	}
	for _, e := range events {
		switch e.Msg {
		case msgStarting:
			stop(last) // a process killed while open wrote no stop line
		case msgStopped:
			stop(e.Time)
		case msgBreakerOpen:
			if !open && e.To != "closed" {
				open, from = true, e.Time
			}
		case msgBreakerClosed:
			if open {
				out = append(out, Span{From: from, To: e.Time})
				open = false
			}
		}
		last = e.Time
	}
	stop(last)
	return out
}
