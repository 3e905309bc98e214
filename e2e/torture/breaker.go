package torture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// The gateway's log messages the checker reads (gateway/limiter and gateway, JSON via
// log/slog with a "time" field): its breaker leaving and reaching the closed state
// ("redis circuit breaker state changed; decisions from local fallback", with from and
// to, and "redis circuit breaker closed; decisions from redis again"; matched by these
// prefixes), and its process starting and stopping.
const (
	msgBreakerOpen   = "redis circuit breaker state changed"
	msgBreakerClosed = "redis circuit breaker closed"
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
		msg := l.Msg
		switch {
		case strings.HasPrefix(msg, msgBreakerOpen):
			msg = msgBreakerOpen
		case strings.HasPrefix(msg, msgBreakerClosed):
			msg = msgBreakerClosed
		case msg == msgStarting || msg == msgStopped:
		default:
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil {
			return nil, fmt.Errorf("line %d (%q): time %q: %w", line, msg, l.Time, err)
		}
		out = append(out, LogEvent{Time: t, Msg: msg, From: l.From, To: l.To})
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
			if e.To == "closed" { // a state change to closed under the other message
				if open {
					out = append(out, Span{From: from, To: e.Time})
					open = false
				}
			} else if !open {
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
