package status

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"
)

// view is the page template's data.
type view struct {
	S          *Status
	Title      string
	At         time.Time
	PromNote   string // empty when every Prometheus answered
	Charts     []chart
	Colors     map[string]string // region -> chart colour
	RateWindow string
	ChartRange string
	Refresh    int // seconds between automatic reloads (when the reader turns them on)
}

func pageData(st *Status, cfg Config) view {
	v := view{S: st, Title: "Rebalancer status", At: st.GeneratedAt, Colors: map[string]string{},
		RateWindow: shortDuration(cfg.RateWindow), ChartRange: shortDuration(cfg.ChartRange), Refresh: 30}
	for i, r := range st.Regions {
		v.Colors[r.Name] = regionColor(i)
	}
	switch p := st.Prometheus; {
	case !p.Configured:
		v.PromNote = "No Prometheus configured: live rates and charts are not shown."
	case p.Reachable:
	case len(p.Unreachable) == 1 && p.Unreachable[0] != "*" && len(cfg.Prometheus) > 1:
		v.PromNote = fmt.Sprintf("Prometheus unreachable for %s: its live rates and chart lines are missing. Shares and changes come from PostgreSQL.", p.Unreachable[0])
	case len(p.Unreachable) < len(cfg.Prometheus):
		v.PromNote = fmt.Sprintf("Prometheus unreachable for %s: their live rates and chart lines are missing. Shares and changes come from PostgreSQL.", strings.Join(p.Unreachable, ", "))
	default:
		v.PromNote = "Prometheus unreachable: live rates and charts are missing. Regions, shares and changes below come from PostgreSQL."
	}
	end := st.GeneratedAt.Truncate(chartStep(cfg.ChartRange))
	start := end.Add(-cfg.ChartRange)
	step := chartStep(cfg.ChartRange)
	v.Charts = []chart{
		newChart("chart-throttled", "Throttled requests per second", st.Charts.ThrottledRPS, start, end, step, 0, formatRate),
		newChart("chart-share", "Default share", st.Charts.Share, start, end, step, 1, formatShare),
	}
	for i := range v.Charts {
		if v.Charts[i].Empty {
			v.Charts[i].EmptyText = "no data in the last " + v.ChartRange
			if st.Prometheus.Configured && !st.Prometheus.Reachable {
				v.Charts[i].EmptyText = "Prometheus unreachable"
			}
		}
	}
	return v
}

func formatShare(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }

// formatRate prints a request rate with up to three significant digits and no trailing
// zeros: 140, 20, 7.5, 0.25.
func formatRate(v float64) string {
	var out string
	switch a := math.Abs(v); {
	case a >= 100:
		out = fmt.Sprintf("%.0f", v)
	case a >= 10:
		out = fmt.Sprintf("%.1f", v)
	default:
		out = fmt.Sprintf("%.2f", v)
	}
	if strings.Contains(out, ".") {
		out = strings.TrimRight(strings.TrimRight(out, "0"), ".")
	}
	if out == "-0" {
		out = "0"
	}
	return out
}

var funcs = template.FuncMap{
	// pct prints a share as a percentage with one decimal.
	"pct": func(v float64) string { return fmt.Sprintf("%.1f%%", v*100) },
	// optPct prints a *float64 share, or an em dash.
	"optPct": func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f%%", *v*100)
	},
	// optRate prints a *float64 request rate, or an em dash.
	"optRate": func(v *float64) string {
		if v == nil {
			return "—"
		}
		return formatRate(*v)
	},
	"rate": formatRate,
	// pp prints a share difference in percentage points, signed.
	"pp": func(v float64) string { return fmt.Sprintf("%+.1f pp", v*100) },
	// clock prints a UTC time as 2006-01-02 15:04:05Z.
	"clock": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	// iso is the datetime attribute of <time>.
	"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	// ago prints how long before now t was.
	"ago": func(now, t time.Time) string {
		d := now.Sub(t)
		if d < time.Second {
			return "just now"
		}
		if d >= 48*time.Hour {
			return fmt.Sprintf("%dd ago", d/(24*time.Hour))
		}
		return shortDuration(d.Truncate(time.Second)) + " ago"
	},
	"until": func(now, t time.Time) string {
		d := t.Sub(now)
		if d <= 0 {
			return "expired"
		}
		return "in " + shortDuration(d.Truncate(time.Second))
	},
	"deref": func(t *time.Time) time.Time { return *t },
}
