package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/regions"
)

// Header is the first line of a trace that is not a comment.
const Header = "time_seconds,region,tenant,offered_rps"

// Limits on a trace, so a bad file cannot exhaust memory.
const (
	MaxSeconds = 7 * 24 * 3600 // the last time point
	MaxRegions = 32
	MaxTenants = 1000
	MaxOffered = 1e9 // requests per second
	maxLine    = 4096
)

// ErrTrace is wrapped by every trace parse error.
var ErrTrace = errors.New("invalid trace")

// Trace is a parsed demand trace.
//
// Format (CSV, one record per line):
//
//	# any comment
//	# regions,us-east,eu-west          optional, before the first row: region order
//	# event,600,shop-a,flash crowd      a demand shift at 600 s for a tenant, or *
//	# untracked,shop-x,shop-y           tenants without a scope of their own: they follow *
//	# region-added,900,ap-south         a region that exists from 900 s on (absent before)
//	# region-removed,1800,ap-south      a region that no longer exists from 1800 s on
//	time_seconds,region,tenant,offered_rps
//	0,us-east,shop-a,700
//	0,eu-west,shop-a,300
//
// Rows are in non-decreasing time order; each distinct time_seconds is a time point
// whose rows hold until the next time point, and the trace ends one second after the
// last. A region with no row at a time point is dark until the next one (no heartbeats,
// no metrics); a tenant with no row in a live region offers 0 there.
type Trace struct {
	// Name labels reports (ParseTrace leaves it empty; callers set e.g. the file name).
	Name    string
	Regions []string
	Tenants []string
	Events  []Event
	// Untracked lists the tenants with no scope of their own (# untracked): they follow
	// "*", which the policy splits from their summed demand, as the job does.
	Untracked []string
	// RegionChanges are the regions added and removed during the trace (# region-added,
	// # region-removed), in time order.
	RegionChanges []RegionChange
	points        []point
}

// RegionChange is a region added to or removed from the deployment at a time.
type RegionChange struct {
	At     int    `json:"time_seconds"`
	Region string `json:"region"`
	Added  bool   `json:"added"`
}

// Event marks a demand shift; convergence is measured from it.
type Event struct {
	At     int    `json:"time_seconds"`
	Tenant string `json:"tenant"` // a tenant, or "*" for all
	Label  string `json:"label"`
}

type point struct {
	t    int
	rows []row
}

type row struct {
	region, tenant int
	offered        float64
}

// Seconds is the trace's length: one second past its last time point.
func (t *Trace) Seconds() int {
	if len(t.points) == 0 {
		return 0
	}
	return t.points[len(t.points)-1].t + 1
}

// ParseTrace reads a trace. Errors name the line.
func ParseTrace(r io.Reader) (*Trace, error) {
	p := parser{tr: &Trace{}, regionIdx: map[string]int{}, tenantIdx: map[string]int{}, seen: map[[2]int]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1024), maxLine)
	line := 0
	for sc.Scan() {
		line++
		if err := p.line(strings.TrimSpace(sc.Text())); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrTrace, line+1, maxLine)
		}
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if err := p.finish(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTrace, err)
	}
	return p.tr, nil
}

type parser struct {
	tr                   *Trace
	regionIdx, tenantIdx map[string]int
	fixedRegions         bool
	header               bool
	seen                 map[[2]int]bool // (region, tenant) at the current time point
}

func (p *parser) line(s string) error {
	switch {
	case s == "":
		return nil
	case strings.HasPrefix(s, "#"):
		return p.directive(strings.TrimSpace(s[1:]))
	case !p.header:
		if s != Header {
			return fmt.Errorf("want the header %q before any row, got %q", Header, clip(s))
		}
		p.header = true
		return nil
	default:
		return p.row(s)
	}
}

func (p *parser) directive(s string) error {
	name, rest, _ := strings.Cut(s, ",")
	switch strings.TrimSpace(name) {
	case "regions":
		if p.fixedRegions || len(p.tr.points) > 0 {
			return errors.New("# regions must come once, before the first row")
		}
		for _, r := range strings.Split(rest, ",") {
			r = strings.TrimSpace(r)
			if err := p.addRegion(r); err != nil {
				return err
			}
		}
		p.fixedRegions = true
	case "untracked":
		for _, tn := range strings.Split(rest, ",") {
			tn = strings.TrimSpace(tn)
			if err := regions.ValidateID("tenant", tn); err != nil {
				return fmt.Errorf("untracked: %w", err)
			}
			p.tr.Untracked = append(p.tr.Untracked, tn)
		}
	case "region-added", "region-removed":
		f := strings.SplitN(rest, ",", 2)
		if len(f) != 2 {
			return fmt.Errorf("want # %s,TIME_SECONDS,REGION", name)
		}
		at, err := parseSeconds(f[0])
		if err != nil {
			return fmt.Errorf("%s time: %w", name, err)
		}
		region := strings.TrimSpace(f[1])
		if _, ok := p.regionIdx[region]; !ok {
			if p.fixedRegions {
				return fmt.Errorf("region %q is not in the # regions line", region)
			}
			if err := p.addRegion(region); err != nil {
				return err
			}
		}
		if n := len(p.tr.RegionChanges); n > 0 && p.tr.RegionChanges[n-1].At > at {
			return errors.New("region changes must be in time order")
		}
		p.tr.RegionChanges = append(p.tr.RegionChanges, RegionChange{At: at, Region: region, Added: name == "region-added"})
	case "event":
		f := strings.SplitN(rest, ",", 3)
		if len(f) != 3 {
			return errors.New("want # event,TIME_SECONDS,TENANT|*,LABEL")
		}
		at, err := parseSeconds(f[0])
		if err != nil {
			return fmt.Errorf("event time: %w", err)
		}
		tenant := strings.TrimSpace(f[1])
		if tenant != regions.Wildcard {
			if err := regions.ValidateID("tenant", tenant); err != nil {
				return fmt.Errorf("event: %w", err)
			}
		}
		label := strings.TrimSpace(f[2])
		if label == "" || len(label) > 200 {
			return errors.New("event label must be 1 to 200 characters")
		}
		p.tr.Events = append(p.tr.Events, Event{At: at, Tenant: tenant, Label: label})
	}
	return nil // any other comment
}

func (p *parser) addRegion(r string) error {
	if err := regions.ValidateID("region", r); err != nil {
		return err
	}
	if _, dup := p.regionIdx[r]; dup {
		return fmt.Errorf("region %s listed twice", r)
	}
	if len(p.tr.Regions) == MaxRegions {
		return fmt.Errorf("more than %d regions", MaxRegions)
	}
	p.regionIdx[r] = len(p.tr.Regions)
	p.tr.Regions = append(p.tr.Regions, r)
	return nil
}

func (p *parser) row(s string) error {
	f := strings.Split(s, ",")
	if len(f) != 4 {
		return fmt.Errorf("want 4 fields (%s), got %d", Header, len(f))
	}
	t, err := parseSeconds(f[0])
	if err != nil {
		return fmt.Errorf("time_seconds: %w", err)
	}
	region, tenant := strings.TrimSpace(f[1]), strings.TrimSpace(f[2])
	ri, ok := p.regionIdx[region]
	if !ok {
		if p.fixedRegions {
			return fmt.Errorf("region %q is not in the # regions line", region)
		}
		if err := p.addRegion(region); err != nil {
			return err
		}
		ri = p.regionIdx[region]
	}
	if err := regions.ValidateID("tenant", tenant); err != nil {
		return err
	}
	ti, ok := p.tenantIdx[tenant]
	if !ok {
		if len(p.tr.Tenants) == MaxTenants {
			return fmt.Errorf("more than %d tenants", MaxTenants)
		}
		ti = len(p.tr.Tenants)
		p.tenantIdx[tenant] = ti
		p.tr.Tenants = append(p.tr.Tenants, tenant)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(f[3]), 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > MaxOffered {
		return fmt.Errorf("offered_rps %q must be a number in [0, %g]", clip(f[3]), float64(MaxOffered))
	}
	pts := p.tr.points
	switch {
	case len(pts) == 0 || pts[len(pts)-1].t < t:
		p.tr.points = append(pts, point{t: t})
		clear(p.seen)
	case pts[len(pts)-1].t > t:
		return fmt.Errorf("time %d is before the previous row's %d (rows must be in time order)", t, pts[len(pts)-1].t)
	}
	key := [2]int{ri, ti}
	if p.seen[key] {
		return fmt.Errorf("second row for region %s tenant %s at time %d", region, tenant, t)
	}
	p.seen[key] = true
	last := &p.tr.points[len(p.tr.points)-1]
	last.rows = append(last.rows, row{region: ri, tenant: ti, offered: v})
	return nil
}

func (p *parser) finish() error {
	if !p.header {
		return fmt.Errorf("no header line %q", Header)
	}
	if len(p.tr.points) == 0 {
		return errors.New("no rows")
	}
	end := p.tr.Seconds()
	for _, u := range p.tr.Untracked {
		if _, ok := p.tenantIdx[u]; !ok {
			return fmt.Errorf("untracked tenant %s has no rows", u)
		}
	}
	for _, c := range p.tr.RegionChanges {
		if c.At >= end {
			return fmt.Errorf("region %s changes at %d s, after the trace ends (%d s)", c.Region, c.At, end)
		}
	}
	for _, e := range p.tr.Events {
		if e.At >= end {
			return fmt.Errorf("event %q at %d s is after the trace ends (%d s)", e.Label, e.At, end)
		}
		if _, ok := p.tenantIdx[e.Tenant]; !ok && e.Tenant != regions.Wildcard {
			return fmt.Errorf("event %q names tenant %s, which has no rows", e.Label, e.Tenant)
		}
	}
	return nil
}

func parseSeconds(s string) (int, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 || v > MaxSeconds {
		return 0, fmt.Errorf("%q must be whole seconds in [0, %d]", clip(s), MaxSeconds)
	}
	return v, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
