package sim

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is what one policy did on one trace. Ratios are fractions (0.01 = 1%).
type Report struct {
	Trace  string `json:"trace,omitempty"`
	Policy string `json:"policy"`
	// Utilisation is admitted / min(offered, C + R x duration), summed over tenants.
	Utilisation float64 `json:"utilisation"`
	// OverAdmission is the admissions that one global bucket per tenant, charged with
	// the actual admissions, would have rejected, over all admissions.
	OverAdmission float64 `json:"over_admission"`
	// WorstMinuteOverAdmission is the same over the worst tenant-minute (aligned
	// minutes).
	WorstMinuteOverAdmission float64 `json:"worst_minute_over_admission"`
	// UnnecessaryThrottle is the rejections that one global bucket per tenant, charged
	// with the actual admissions, could have admitted, over all offered requests. The
	// bucket is also charged with the rejections it counts, so no token counts twice.
	UnnecessaryThrottle float64 `json:"unnecessary_throttle"`
	// WorstRegionUnnecessaryThrottle is the same for the worst region: its share of each
	// second's unnecessary rejections (in proportion to its rejections) over its offered.
	WorstRegionUnnecessaryThrottle float64 `json:"worst_region_unnecessary_throttle"`
	// ConvergenceSeconds has one entry per trace event.
	ConvergenceSeconds []Convergence `json:"convergence_seconds"`
	// Writes counts share changes decided, over every tenant (a shrink-before-grow
	// change is one write delivered in two transactions).
	Writes int `json:"writes"`
	// TenantRegions is, per tenant and region with traffic, what it was admitted against
	// what the equal split would have let through (the tests' tail targets).
	TenantRegions []TenantRegion `json:"-"`
	// GlobalMaxShare is, per region, the largest "*" share written during the run (the
	// untracked tenants' scope; empty without untracked tenants).
	GlobalMaxShare map[string]float64 `json:"-"`
}

// TenantRegion is one tenant's admissions in one region over a run.
type TenantRegion struct {
	Tenant, Region string
	Offered        float64
	Admitted       float64
	// EqualSplit is the sum over seconds of min(offered, refill / regions): what the
	// equal split's refill admits, burst aside.
	EqualSplit float64
}

// Convergence is how long after an event the event's tenant (all tenants for "*") had
// its first minute in which no second's unnecessary rejections exceeded 1% of its
// offered requests. Seconds is nil when that never happened before the trace ended.
type Convergence struct {
	Event
	Seconds *int `json:"seconds"`
}

// converged is the per-second tolerance behind Convergence, and the minute it must hold.
const (
	convergedFraction = 0.01
	convergedSeconds  = 60
)

// meter measures one tenant's run against one global bucket and adds into run.
type meter struct {
	r          *run
	j          int
	over, unn  float64 // shadow global buckets: over (actual admissions only), unnecessary
	admitted   float64
	offered    float64
	minuteAdm  float64
	minuteOver float64
}

func newMeter(r *run, j int) *meter {
	C := float64(r.cfg.Capacity)
	r.tenantOffered[j] = make([]float64, r.T)
	r.tenantUnnecessary[j] = make([]float64, r.T)
	return &meter{r: r, j: j, over: C, unn: C}
}

func (m *meter) second(t int, adm, rej []float64) {
	r := m.r
	C, R := float64(r.cfg.Capacity), r.cfg.Refill
	a, x, o := 0.0, 0.0, 0.0
	for i := range adm {
		a += adm[i]
		x += rej[i]
		o += adm[i] + rej[i]
		r.regionOffered[i] += adm[i] + rej[i]
	}
	// Over-admission: a global bucket charged with the actual admissions.
	m.over = math.Min(C, m.over+R)
	over := 0.0
	if a > m.over {
		over, m.over = a-m.over, 0
	} else {
		m.over -= a
	}
	// Unnecessary throttling: a global bucket charged with the actual admissions and
	// with the rejections it could have admitted.
	m.unn = math.Max(0, math.Min(C, m.unn+R)-a)
	u := math.Min(x, m.unn)
	m.unn -= u
	if u > 0 {
		for i := range rej {
			r.regionUnnecessary[i] += u * rej[i] / x
		}
	}
	m.admitted += a
	m.offered += o
	r.over += over
	r.unnecessary += u
	r.tenantOffered[m.j][t] = o
	r.tenantUnnecessary[m.j][t] = u
	m.minuteAdm += a
	m.minuteOver += over
	if (t+1)%60 == 0 || t == r.T-1 {
		if m.minuteAdm > 0 {
			r.worstMinuteOver = math.Max(r.worstMinuteOver, m.minuteOver/m.minuteAdm)
		}
		m.minuteAdm, m.minuteOver = 0, 0
	}
}

func (m *meter) finish() {
	r := m.r
	r.admitted += m.admitted
	r.offered += m.offered
	r.bound += math.Min(m.offered, float64(r.cfg.Capacity)+r.cfg.Refill*float64(r.T))
}

func (r *run) report() Report {
	rep := Report{
		Trace:                    r.tr.Name,
		Policy:                   r.policy.String(),
		Utilisation:              ratio(r.admitted, r.bound),
		OverAdmission:            ratio(r.over, r.admitted),
		WorstMinuteOverAdmission: r.worstMinuteOver,
		UnnecessaryThrottle:      ratio(r.unnecessary, r.offered),
		Writes:                   r.writes,
		ConvergenceSeconds:       []Convergence{},
		TenantRegions:            r.tenantRegions,
		GlobalMaxShare:           r.globalMax,
	}
	for i := range r.regionOffered {
		rep.WorstRegionUnnecessaryThrottle = math.Max(rep.WorstRegionUnnecessaryThrottle, ratio(r.regionUnnecessary[i], r.regionOffered[i]))
	}
	for _, e := range r.tr.Events {
		rep.ConvergenceSeconds = append(rep.ConvergenceSeconds, Convergence{Event: e, Seconds: r.convergence(e)})
	}
	return rep
}

func (r *run) convergence(e Event) *int {
	off, unn := make([]float64, r.T), make([]float64, r.T)
	for j, name := range r.tr.Tenants {
		if e.Tenant != "*" && e.Tenant != name {
			continue
		}
		for t := range r.T {
			off[t] += r.tenantOffered[j][t]
			unn[t] += r.tenantUnnecessary[j][t]
		}
	}
	good := 0
	for t := e.At; t < r.T; t++ {
		if unn[t] <= convergedFraction*off[t]+1e-9 {
			good++
		} else {
			good = 0
		}
		if good == convergedSeconds {
			s := t + 1 - convergedSeconds - e.At
			return &s
		}
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// WriteTable writes reports as an aligned text table for people; the columns are
// percentages except convergence (seconds per event, "never" when it did not converge) and
// writes.
func WriteTable(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "trace\tpolicy\tutil %\tover %\tworst-min over %\tunnec. throttle %\tworst-region unnec. %\tconvergence s\twrites\t")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s\t%d\t\n", r.Trace, r.Policy,
			100*r.Utilisation, 100*r.OverAdmission, 100*r.WorstMinuteOverAdmission,
			100*r.UnnecessaryThrottle, 100*r.WorstRegionUnnecessaryThrottle, convergenceCell(r.ConvergenceSeconds), r.Writes)
	}
	return tw.Flush()
}

// WriteMarkdown writes reports as a Markdown table (docs/rebalancer.md).
func WriteMarkdown(w io.Writer, reports []Report) error {
	var b strings.Builder
	b.WriteString("| trace | policy | utilisation % | over-admission % | worst minute over % | unnecessary throttle % | worst region unnecessary % | convergence s | writes |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range reports {
		fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %d |\n", r.Trace, r.Policy,
			100*r.Utilisation, 100*r.OverAdmission, 100*r.WorstMinuteOverAdmission,
			100*r.UnnecessaryThrottle, 100*r.WorstRegionUnnecessaryThrottle, convergenceCell(r.ConvergenceSeconds), r.Writes)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func convergenceCell(cs []Convergence) string {
	if len(cs) == 0 {
		return "-"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		if c.Seconds == nil {
			parts[i] = "never"
		} else {
			parts[i] = strconv.Itoa(*c.Seconds)
		}
	}
	return strings.Join(parts, " / ")
}
