package results

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The formatters of every figure in the documents: the templates call them through
// funcs, the targets through show.

func fmtMs(ms float64) string { return strconv.FormatFloat(ms, 'f', 2, 64) + " ms" }

func fmtSignedMs(ms float64) string {
	if ms >= 0 {
		return "+" + fmtMs(ms)
	}
	return "−" + fmtMs(-ms)
}

func fmtUs(us float64) string {
	switch {
	case us >= 10_000:
		return strconv.FormatFloat(us/1000, 'f', 1, 64) + " ms"
	case us >= 1000:
		return strconv.FormatFloat(us/1000, 'f', 2, 64) + " ms"
	case us >= 10:
		return strconv.FormatFloat(us, 'f', 0, 64) + " µs"
	}
	return strconv.FormatFloat(us, 'f', 2, 64) + " µs"
}

func fmtInt(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "−" + b.String()
	}
	return b.String()
}

func fmtF(prec int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
}

func fmtX(v float64) string    { return strconv.FormatFloat(v, 'f', 2, 64) + "x" }
func fmtPct(v float64) string  { return strconv.FormatFloat(v, 'f', 2, 64) + "%" }
func fmtMB(b float64) string   { return strconv.FormatFloat(b/1e6, 'f', 1, 64) + " MB" }
func fmtSecs(s float64) string { return strconv.FormatFloat(s, 'f', 2, 64) + " s" }

// show formats a stat: the median and, when the runs differ at this precision, the
// range: "1.2 [1.1–1.4]"; "–" when nothing was measured.
func show(s Stat, f func(float64) string) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 || f(s.Min) == f(s.Max) {
		return f(s.Med)
	}
	return f(s.Med) + " [" + f(s.Min) + "–" + f(s.Max) + "]"
}

// figure adapts a formatter to the values a template hands it: a Stat (median and
// range), or a plain number.
func figure(f func(float64) string) func(any) (string, error) {
	return func(v any) (string, error) {
		switch x := v.(type) {
		case Stat:
			return show(x, f), nil
		case *Stat:
			if x == nil {
				return "–", nil
			}
			return show(*x, f), nil
		case float64:
			return f(x), nil
		case int:
			return f(float64(x)), nil
		case int64:
			return f(float64(x)), nil
		}
		return "", fmt.Errorf("cannot format %T as a figure", v)
	}
}
