package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/rebalancer/status/figures"
)

// promData is what one view read from Prometheus; a failed server's data is absent.
type promData struct {
	// live holds the live figures; the page shows their rates, demand.RegionOfferedQuery
	// through figures.Read, the offered demand the rebalancer acts on.
	live      figures.Result
	throttled map[string][]Point
	share     map[string][]Point
	failed    []string // "*" or the region of each server that failed
	err       error    // the first failure, for the log
}

// chartStep is the step of a chart's range query: chartPoints steps over the range.
func chartStep(r time.Duration) time.Duration {
	return max(time.Second, (r / chartPoints).Truncate(time.Second))
}

// figures is the source as figures.Read takes it.
func (s Source) figures() figures.Source { return figures.Source{Region: s.Region, API: s.API} }

// queryPrometheus reads the live figures (figures.Read) and the two charts' range
// queries (throttled rate and share per region) on every server concurrently.
func (h *Handler) queryPrometheus(ctx context.Context, now time.Time) promData {
	d := promData{throttled: map[string][]Point{}, share: map[string][]Point{}}
	step := chartStep(h.cfg.ChartRange)
	// Align the range to the step so consecutive views draw the same points.
	end := now.Truncate(step)
	rng := promv1.Range{Start: end.Add(-h.cfg.ChartRange), End: end, Step: step}
	srcs := make([]figures.Source, len(h.cfg.Prometheus))
	for i, src := range h.cfg.Prometheus {
		srcs[i] = src.figures()
	}
	var (
		mu        sync.Mutex
		wg        sync.WaitGroup
		chartErrs = make([][2]error, len(srcs))
	)
	wg.Go(func() {
		d.live = figures.Read(ctx, srcs, figures.Options{Window: h.cfg.RateWindow, At: now, RatesOnly: true})
	})
	for i, src := range h.cfg.Prometheus {
		for j, q := range []struct {
			query string
			into  map[string][]Point
		}{{figures.ThrottledQuery(h.cfg.RateWindow, src.Region), d.throttled}, {figures.ShareQuery(src.Region, ""), d.share}} {
			wg.Go(func() {
				m, err := queryRange(ctx, src, q.query, rng)
				chartErrs[i][j] = err
				mu.Lock()
				defer mu.Unlock()
				for r, pts := range m {
					q.into[r] = pts
				}
			})
		}
	}
	wg.Wait()
	for i, src := range h.cfg.Prometheus {
		if err := errors.Join(d.live.Errors[i], chartErrs[i][0], chartErrs[i][1]); err != nil {
			name := cmp.Or(src.Region, "*")
			d.failed = append(d.failed, name)
			if d.err == nil {
				d.err = fmt.Errorf("prometheus %s: %w", name, err)
			}
		}
	}
	slices.Sort(d.failed)
	return d
}

func queryRange(ctx context.Context, src Source, q string, r promv1.Range) (map[string][]Point, error) {
	v, _, _, err := src.API.QueryRange(ctx, q, r)
	if err != nil {
		return nil, err
	}
	mat, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("range: unexpected result type %s", v.Type())
	}
	out := map[string][]Point{}
	for _, s := range mat {
		region := string(s.Metric["region"])
		if !src.figures().Owns(region) {
			continue
		}
		pts := make([]Point, 0, len(s.Values))
		for _, p := range s.Values {
			if finite(float64(p.Value)) {
				pts = append(pts, Point{T: p.Timestamp.Time().UTC(), V: float64(p.Value)})
			}
		}
		out[region] = pts
	}
	return out, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// seriesOf lists the known regions' series in region order; a region without data has
// an empty series.
func seriesOf(regionNames []string, m map[string][]Point) []Series {
	out := make([]Series, 0, len(regionNames))
	for _, r := range regionNames {
		pts := m[r]
		if pts == nil {
			pts = []Point{}
		}
		out = append(out, Series{Region: r, Points: pts})
	}
	return out
}
