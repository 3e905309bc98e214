package status

import (
	"strings"
	"testing"
	"time"
)

func TestNiceCeil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want float64 }{
		{0, 1}, {-3, 1}, {0.3, 0.5}, {1, 1}, {1.01, 2}, {2.2, 2.5}, {3, 5}, {7, 10}, {20, 20}, {21, 25}, {140, 200}, {999, 1000},
	} {
		if got := niceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestRateTickCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		max  float64
		want int
	}{{1, 5}, {2, 4}, {2.5, 5}, {5, 5}, {10, 5}, {20, 4}, {25, 5}, {0.5, 5}, {200, 4}} {
		if got := rateTickCount(tc.max); got != tc.want {
			t.Errorf("rateTickCount(%v) = %d, want %d", tc.max, got, tc.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 90 * time.Minute: "1h30m", 15 * time.Minute: "15m", 90 * time.Second: "1m30s", 5 * time.Second: "5s", 0: "0s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSegments(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s ...int) []Point {
		var p []Point
		for _, v := range s {
			p = append(p, Point{T: t0.Add(time.Duration(v) * time.Second), V: float64(v)})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		in   []Point
		want []int // segment lengths
	}{
		{"empty", nil, nil},
		{"one", at(0), []int{1}},
		{"contiguous", at(0, 10, 20, 30), []int{4}},
		{"two steps apart still joins", at(0, 20, 30), []int{3}},
		{"gap", at(0, 10, 50, 60), []int{2, 2}},
		{"lone point after a gap", at(0, 10, 40), []int{2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for _, s := range segments(tc.in, 10*time.Second) {
				got = append(got, len(s))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("segments %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("segments %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestNewChart(t *testing.T) {
	t.Parallel()
	end := time.Unix(7200, 0)
	start := end.Add(-time.Hour)
	step := 30 * time.Second
	series := []Series{
		{Region: "a", Points: []Point{{start, 0}, {start.Add(step), 7}, {start.Add(2 * step), 14}}},
		{Region: "b", Points: []Point{{end, 3}}},
		{Region: "c", Points: []Point{}},
	}
	c := newChart("x", "Throttled", series, start, end, step, 0, formatRate)
	if len(c.YTicks) != 5 || c.YTicks[4].Label != "20" || c.YTicks[1].Label != "5" || c.YTicks[0].Pos != padTop+plotH || c.YTicks[4].Pos != padTop {
		t.Errorf("y ticks %+v, want 0..20 with 20 at the top", c.YTicks)
	}
	if c.XTicks[0].Label != "-1h" || c.XTicks[0].Pos != padLeft || c.XTicks[timeTicks].Label != "now" || c.XTicks[timeTicks].Pos != padLeft+plotW {
		t.Errorf("x ticks %+v", c.XTicks)
	}
	if len(c.Lines) != 2 || c.Lines[0].Dot || !c.Lines[1].Dot || c.Lines[1].X != padLeft+plotW {
		t.Fatalf("lines %+v, want a polyline for a and a dot for b", c.Lines)
	}
	first := strings.Fields(c.Lines[0].Points)[0]
	if first != "52,176" { // (padLeft, padTop+plotH): time start, value 0
		t.Errorf("first point %s", first)
	}
	if c.Legend[0].Last != "14" || c.Legend[2].Last != "no data" || c.Empty {
		t.Errorf("legend %+v", c.Legend)
	}
	if e := newChart("y", "Share", []Series{{Region: "a"}}, start, end, step, 1, formatShare); !e.Empty || e.YTicks[shareTicks].Label != "100%" {
		t.Errorf("empty share chart: %+v", e)
	}
}

func TestFormatRate(t *testing.T) {
	t.Parallel()
	for v, want := range map[float64]string{0: "0", 0.25: "0.25", 0.5: "0.5", 5: "5", 7.5: "7.5", 14: "14", 20.04: "20", 12.35: "12.3", 140.4: "140", 1234.5: "1234"} {
		if got := formatRate(v); got != want {
			t.Errorf("formatRate(%v) = %q, want %q", v, got, want)
		}
	}
}
