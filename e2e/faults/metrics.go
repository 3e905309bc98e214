package faults

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// Scrape is one /metrics page by family name.
type Scrape map[string]*dto.MetricFamily

// ScrapeURL reads and parses base + "/metrics".
func ScrapeURL(ctx context.Context, base string) (Scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", base, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", base, err)
	}
	return fams, nil
}

// Sum adds the values of name's series whose labels include every pair of match
// ("k", "v", ...): counters and gauges by value, histograms by count. A missing family
// is 0.
func (s Scrape) Sum(name string, match ...string) float64 {
	total := 0.0
	for _, m := range s[name].GetMetric() {
		if !testenv.LabelsMatch(m, match) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		}
	}
	return total
}

// Hist is a cumulative histogram: Counts[i] observations <= Bounds[i], Total in all.
type Hist struct {
	Bounds []float64
	Counts []float64
	Total  float64
}

// Histogram merges name's histograms whose labels include match (all must share bounds).
func (s Scrape) Histogram(name string, match ...string) Hist {
	var h Hist
	for _, m := range s[name].GetMetric() {
		if m.Histogram == nil || !testenv.LabelsMatch(m, match) {
			continue
		}
		bs := m.Histogram.GetBucket()
		if h.Bounds == nil {
			for _, b := range bs {
				h.Bounds = append(h.Bounds, b.GetUpperBound())
			}
			h.Counts = make([]float64, len(bs))
		}
		for i, b := range bs {
			if i < len(h.Counts) {
				h.Counts[i] += float64(b.GetCumulativeCount())
			}
		}
		h.Total += float64(m.Histogram.GetSampleCount())
	}
	return h
}

// Add adds o (same bounds) to h.
func (h Hist) Add(o Hist) Hist {
	if h.Bounds == nil {
		return Hist{Bounds: o.Bounds, Counts: append([]float64(nil), o.Counts...), Total: o.Total}
	}
	out := Hist{Bounds: h.Bounds, Counts: append([]float64(nil), h.Counts...), Total: h.Total + o.Total}
	for i := range out.Counts {
		if i < len(o.Counts) {
			out.Counts[i] += o.Counts[i]
		}
	}
	return out
}

// Sub is h - o, for the observations between two scrapes of one process. A process
// that restarted in between (h has fewer observations) counts from its restart: h.
func (h Hist) Sub(o Hist) Hist {
	if o.Bounds == nil || h.Total < o.Total {
		return h
	}
	out := Hist{Bounds: h.Bounds, Counts: append([]float64(nil), h.Counts...), Total: h.Total - o.Total}
	for i := range out.Counts {
		if i < len(o.Counts) {
			out.Counts[i] -= o.Counts[i]
		}
	}
	return out
}

// AtMost is the fraction of observations <= bound (bound must be one of the bounds;
// else the next bound above it is used, which overstates the fraction). 1 with none.
func (h Hist) AtMost(bound float64) float64 {
	if h.Total == 0 {
		return 1
	}
	i := sort.SearchFloat64s(h.Bounds, bound-1e-12)
	if i >= len(h.Bounds) {
		return 1
	}
	return h.Counts[i] / h.Total
}

// Quantile estimates the q-quantile as Prometheus's histogram_quantile does: linear
// within the bucket that holds it. Observations above the last bound give +Inf.
func (h Hist) Quantile(q float64) float64 {
	if h.Total == 0 {
		return 0
	}
	rank := q * h.Total
	lower, below := 0.0, 0.0
	for i, b := range h.Bounds {
		if h.Counts[i] >= rank {
			in := h.Counts[i] - below
			if in <= 0 {
				return b
			}
			return lower + (b-lower)*(rank-below)/in
		}
		lower, below = b, h.Counts[i]
	}
	return math.Inf(1)
}
