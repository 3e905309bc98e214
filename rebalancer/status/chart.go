package status

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts are drawn on the server as inline SVG: a chart is a fixed viewBox with one
// polyline per region and segment (a gap in the data breaks the line), so the page needs
// no script to show them.

const (
	chartW, chartH                             = 560, 200
	padLeft, padRight, padTop, padBottom       = 52, 12, 10, 24
	plotW, plotH                               = chartW - padLeft - padRight, chartH - padTop - padBottom
	shareTicks, timeTicks                      = 4, 4
	gapFactor                            int64 = 2 // a gap of more than 2 steps breaks a line
)

// palette colours the regions in order; it repeats after eight.
var palette = []string{"#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"}

func regionColor(i int) string { return palette[i%len(palette)] }

// chart is what the template draws.
type chart struct {
	ID, Title        string
	Width, Height    int
	PlotX, PlotY     int
	PlotW, PlotH     int
	YTicks, XTicks   []tick
	Lines            []line
	Empty            bool
	EmptyText        string
	Legend           []legendItem
	Description      string // for screen readers
	PlotRight, PlotB int
	CX, CY           int // the plot's centre
}

type tick struct {
	Pos   float64 // pixel position along the axis
	Label string
}

type line struct {
	Region string
	Color  string
	Points string // "x,y x,y ..." for a polyline; a single point is drawn as a dot
	Dot    bool
	X, Y   float64
}

type legendItem struct {
	Region, Color, Last string
}

// newChart lays out series (region order) over [start, end]. yMax 0 picks a round
// maximum above the data; format labels the y ticks and the legend's last values.
func newChart(id, title string, series []Series, start, end time.Time, step time.Duration, yMax float64, format func(float64) string) chart {
	c := chart{ID: id, Title: title, Width: chartW, Height: chartH, PlotX: padLeft, PlotY: padTop,
		PlotW: plotW, PlotH: plotH, PlotRight: padLeft + plotW, PlotB: padTop + plotH,
		CX: padLeft + plotW/2, CY: padTop + plotH/2}
	ticks := shareTicks
	if yMax <= 0 {
		top := 0.0
		for _, s := range series {
			for _, p := range s.Points {
				top = math.Max(top, p.V)
			}
		}
		yMax = niceCeil(top)
		ticks = rateTickCount(yMax)
	}
	span := end.Sub(start).Seconds()
	x := func(t time.Time) float64 {
		return round1(float64(padLeft) + float64(plotW)*math.Min(1, math.Max(0, t.Sub(start).Seconds()/span)))
	}
	y := func(v float64) float64 {
		return round1(float64(padTop) + float64(plotH)*(1-math.Min(1, math.Max(0, v/yMax))))
	}
	for i := 0; i <= ticks; i++ {
		v := yMax * float64(i) / float64(ticks)
		c.YTicks = append(c.YTicks, tick{Pos: y(v), Label: format(v)})
	}
	for i := 0; i <= timeTicks; i++ {
		t := start.Add(time.Duration(float64(end.Sub(start)) * float64(i) / timeTicks))
		label := "now"
		if i < timeTicks {
			label = "-" + shortDuration(end.Sub(t))
		}
		c.XTicks = append(c.XTicks, tick{Pos: x(t), Label: label})
	}
	var desc []string
	for i, s := range series {
		color := regionColor(i)
		item := legendItem{Region: s.Region, Color: color, Last: "no data"}
		if n := len(s.Points); n > 0 {
			item.Last = format(s.Points[n-1].V)
			desc = append(desc, s.Region+" now "+item.Last)
		}
		c.Legend = append(c.Legend, item)
		for _, seg := range segments(s.Points, step) {
			if len(seg) == 1 {
				c.Lines = append(c.Lines, line{Region: s.Region, Color: color, Dot: true, X: x(seg[0].T), Y: y(seg[0].V)})
				continue
			}
			var b strings.Builder
			for j, p := range seg {
				if j > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(strconv.FormatFloat(x(p.T), 'f', -1, 64))
				b.WriteByte(',')
				b.WriteString(strconv.FormatFloat(y(p.V), 'f', -1, 64))
			}
			c.Lines = append(c.Lines, line{Region: s.Region, Color: color, Points: b.String()})
		}
	}
	c.Empty = len(c.Lines) == 0
	c.Description = title + " over the last " + shortDuration(end.Sub(start))
	if len(desc) > 0 {
		c.Description += ": " + strings.Join(desc, ", ")
	}
	return c
}

// segments splits points where consecutive samples are more than gapFactor steps apart.
func segments(pts []Point, step time.Duration) [][]Point {
	var out [][]Point
	startIdx := 0
	for i := 1; i <= len(pts); i++ {
		if i == len(pts) || pts[i].T.Sub(pts[i-1].T) > time.Duration(gapFactor)*step {
			if i > startIdx {
				out = append(out, pts[startIdx:i])
			}
			startIdx = i
		}
	}
	return out
}

// rateTickCount divides a niceCeil maximum into round steps: 2 into 4 steps of 0.5,
// 1, 2.5 and 5 into 5 steps of 0.2, 0.5 and 1 (times a power of ten).
func rateTickCount(yMax float64) int {
	m := yMax / math.Pow(10, math.Floor(math.Log10(yMax)))
	if math.Abs(m-2) < 1e-9 {
		return 4
	}
	return 5
}

// niceCeil is the smallest of 1, 2, 2.5, 5 x 10^k at or above v (1 for v <= 0), so the
// ticks fall on round numbers.
func niceCeil(v float64) float64 {
	if v <= 0 || !finite(v) {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*exp >= v*(1-1e-9) {
			return m * exp
		}
	}
	return 10 * exp
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// shortDuration prints 1h, 45m, 30s, 1h30m.
func shortDuration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%02dm", d/time.Hour, (d%time.Hour)/time.Minute)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, (d%time.Minute)/time.Second)
	default:
		return fmt.Sprintf("%ds", d/time.Second)
	}
}
