package status

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/rebalancer/demand"
)

// The PromQL behind the page, on the gateways' metrics contract. The live rates are
// demand.RegionOfferedQuery, the rebalancer's own, so the page shows the offered demand
// the rebalancer acts on.
const (
	// throttledQuery: the throttled rate per region (the throttle chart).
	throttledQuery = `sum by (region) (rate(` + demand.RequestsMetric + `{decision="` + demand.DecisionThrottled + `"}[%s]))`
	// shareQuery: the default share the region's gateways enforce (the share chart).
	shareQuery = `avg by (region) (ratelimit_region_share_ratio{scope="*"})`
)

// promData is what one view read from Prometheus; a failed server's data is absent.
type promData struct {
	rates     map[string]demand.Rates
	throttled map[string][]Point
	share     map[string][]Point
	failed    []string // "*" or the region of each server that failed
	err       error    // the first failure, for the log
}

// chartStep is the step of a chart's range query: chartPoints steps over the range.
func chartStep(r time.Duration) time.Duration {
	return max(time.Second, (r / chartPoints).Truncate(time.Second))
}

// queryPrometheus runs the three queries on every server concurrently.
func (h *Handler) queryPrometheus(ctx context.Context, now time.Time) promData {
	d := promData{rates: map[string]demand.Rates{}, throttled: map[string][]Point{}, share: map[string][]Point{}}
	win := model.Duration(h.cfg.RateWindow).String()
	step := chartStep(h.cfg.ChartRange)
	// Align the range to the step so consecutive views draw the same points.
	end := now.Truncate(step)
	rng := promv1.Range{Start: end.Add(-h.cfg.ChartRange), End: end, Step: step}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, src := range h.cfg.Prometheus {
		name := src.Region
		if name == "" {
			name = "*"
		}
		var errs [3]error
		var sw sync.WaitGroup
		sw.Go(func() {
			v, _, _, err := src.API.Query(ctx, demand.RegionOfferedQuery(h.cfg.RateWindow, src.Region), now)
			errs[0] = err
			if err != nil {
				return
			}
			vec, ok := v.(model.Vector)
			if !ok {
				errs[0] = fmt.Errorf("rates: unexpected result type %s", v.Type())
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range vec {
				region := string(s.Metric["region"])
				if !src.owns(region) || !finite(float64(s.Value)) {
					continue
				}
				r := d.rates[region]
				if r.Add(string(s.Metric["decision"]), float64(s.Value)) {
					d.rates[region] = r
				}
			}
		})
		for i, q := range []struct {
			query string
			into  map[string][]Point
		}{{fmt.Sprintf(throttledQuery, win), d.throttled}, {shareQuery, d.share}} {
			sw.Go(func() {
				m, err := queryRange(ctx, src, q.query, rng)
				errs[i+1] = err
				mu.Lock()
				defer mu.Unlock()
				for r, pts := range m {
					q.into[r] = pts
				}
			})
		}
		wg.Go(func() {
			sw.Wait()
			if err := errors.Join(errs[:]...); err != nil {
				mu.Lock()
				defer mu.Unlock()
				d.failed = append(d.failed, name)
				if d.err == nil {
					d.err = fmt.Errorf("prometheus %s: %w", name, err)
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(d.failed)
	return d
}

// owns reports whether the server's answer for region counts: a per-region server only
// speaks for its own region.
func (s Source) owns(region string) bool {
	return region != "" && (s.Region == "" || s.Region == region)
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
		if !src.owns(region) {
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
