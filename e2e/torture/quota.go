package torture

import (
	"fmt"
	"sort"
	"time"

	"github.com/quotaplane/quotaplane/regions"
)

// Quota is a tenant's calendar-quota band (regions.Band with a Period): one budget per
// period for the whole fleet, checked by CheckQuotas, not as a bucket per region.
type Quota struct {
	Tenant string
	Band   regions.Band
}

// PeriodMargin is how close to a period boundary an admission's [Sent, Recv] may come
// and still be counted in one period only: the gateway decided it by its own clock
// somewhere in between, on the checker's machine, so a second either side is ample.
// An admission within it of a boundary may be in either period (CheckQuotas).
const PeriodMargin = time.Second

// QuotaPeriod is one period of one quota band as checked: what the fleet admitted in
// it, and its bound B + A(t* − S, t*] split by term (docs/reliability.md, "Calendar
// quotas"). Each admission of the slack counts once, in the first term that covers it.
type QuotaPeriod struct {
	Tenant, Band string
	Start        time.Time
	Budget       int64
	// Admitted are the tokens counted in the period: its own admissions and those of
	// the boundary it was given (Ambiguous of them).
	Admitted, Ambiguous int
	// Last is t*, the period's last admission (its Recv); Count the time of the count
	// that admission was decided with: Last, or for a fallback's admission the start of
	// its gateway's breaker-open span (its bucket was cut from the count then).
	Last, Count time.Time
	// The slack, in tokens: admitted within S before Count (Stale); not seen because
	// PostgreSQL was down within S before Count (Postgres); a fallback's admissions not
	// yet charged to the counter and synced by Count − S (Fallback); a region's
	// admissions within S before its Redis restarted empty, and until it was back
	// (Restart); a stopped gateway's admissions in its last I + M that no later decision
	// of its region showed by Count − S (Stopped).
	Stale, Postgres, Fallback, Restart, Stopped int
}

// Slack is the bound's part above the budget.
func (q QuotaPeriod) Slack() int { return q.Stale + q.Postgres + q.Fallback + q.Restart + q.Stopped }

// Bound is B + A(t* − S, t*] with A split by term.
func (q QuotaPeriod) Bound() int64 { return q.Budget + int64(q.Slack()) }

// Ratio is admitted over the bound.
func (q QuotaPeriod) Ratio() float64 { return float64(q.Admitted) / float64(max(q.Bound(), 1)) }

// Breach reports whether the fleet admitted more than the bound in the period.
func (q QuotaPeriod) Breach() bool { return int64(q.Admitted) > q.Bound() }

func (q QuotaPeriod) String() string {
	return fmt.Sprintf("quota %s#%s period %s: fleet admitted %d (%d of them within %v of a boundary), bound %d = budget %d + stale %d + postgres %d + fallback %d + restart %d + stopped %d; last admission %s, count of %s: %.3fx",
		q.Tenant, q.Band, q.Start.UTC().Format("2006-01-02 15:04"), q.Admitted, q.Ambiguous, PeriodMargin, q.Bound(), q.Budget, q.Stale, q.Postgres, q.Fallback, q.Restart, q.Stopped,
		q.Last.Format("15:04:05.000"), q.Count.Format("15:04:05.000"), q.Ratio())
}

// quotaAdm is one admission with where it was answered.
type quotaAdm struct {
	Admission
	region string
	// from, to are the starts of the periods of Sent − PeriodMargin and Recv +
	// PeriodMargin: equal unless the admission is near a boundary.
	from, to time.Time
}

// CheckQuotas checks every quota band of in.Quotas in every period its tenant was
// admitted in: the fleet's admissions at most B + A(t* − S, t*], S = 2·(I + M), with
// the terms of QuotaPeriod. An admission within PeriodMargin of a boundary may be in
// either period: it counts in the slack terms of both (so a bound is never too small
// for it) and in the admitted count of one, the earlier one while it has room under
// its bound, else the later (for a chain of periods the assignment that fits if any
// does), so the check fails only if no assignment fits.
func CheckQuotas(in Input) []QuotaPeriod {
	gws := map[string]GatewayRun{}
	for _, g := range in.Gateways {
		gws[g.ID] = g
	}
	stale := 2 * (in.QuotaSync + in.QuotaMargin)
	report := in.QuotaSync + in.QuotaMargin
	// open is the breaker-open span of gateway id that [from, to] meets.
	open := func(id string, from, to time.Time) (Span, bool) {
		for _, sp := range gws[id].Open {
			if sp.overlaps(from, to) {
				return sp, true
			}
		}
		return Span{}, false
	}
	lifeOf := func(id string, t time.Time) (Life, bool) {
		for _, l := range gws[id].Lives {
			if !t.Before(l.From) && (!l.Stopped || !t.After(l.To)) {
				return l, true
			}
		}
		return Life{}, false
	}
	var out []QuotaPeriod
	for _, q := range in.Quotas {
		var all []quotaAdm
		for region, as := range in.Admitted[q.Tenant] {
			for _, a := range as {
				from, _ := q.Band.Window(a.Sent.Add(-PeriodMargin))
				to, _ := q.Band.Window(a.Recv.Add(PeriodMargin))
				all = append(all, quotaAdm{Admission: a, region: region, from: from, to: to})
			}
		}
		// decided reports whether some admission of the tenant, other than a fallback's,
		// answered by a gateway ok accepts, was sent after t and answered by until: a
		// decision of Redis whose counter showed what came before it, reported and read
		// back by until + S.
		decided := func(ok func(quotaAdm) bool, t, until time.Time) bool {
			for _, b := range all {
				if b.Sent.After(t) && !b.Recv.After(until) && ok(b) {
					if _, fb := open(b.Gateway, b.Sent, b.Recv); !fb {
						return true
					}
				}
			}
			return false
		}
		starts := map[time.Time]bool{}
		for _, a := range all {
			starts[a.from], starts[a.to] = true, true
		}
		var periods []time.Time
		for s := range starts {
			periods = append(periods, s)
		}
		sort.Slice(periods, func(i, j int) bool { return periods[i].Before(periods[j]) })
		carry := 0 // ambiguous tokens the previous period had no room for
		for i, start := range periods {
			p := QuotaPeriod{Tenant: q.Tenant, Band: q.Band.Name, Start: start, Budget: q.Band.Capacity}
			var cand []quotaAdm
			own, next := 0, 0 // tokens only in this period; shared with the next one
			for _, a := range all {
				switch {
				case a.from.Equal(start) && a.to.Equal(start):
					own += a.Tokens()
				case a.from.Equal(start):
					next += a.Tokens()
				case !a.to.Equal(start):
					continue
				}
				cand = append(cand, a)
			}
			if len(cand) == 0 {
				continue
			}
			last := cand[0]
			for _, a := range cand {
				if a.Recv.After(last.Recv) {
					last = a
				}
			}
			p.Last, p.Count = last.Recv, last.Recv
			if sp, ok := open(last.Gateway, last.Sent, last.Recv); ok {
				p.Count = sp.From
			}
			seenBy := p.Count.Add(-stale)
			for _, a := range cand {
				n := a.Tokens()
				if a.Recv.After(seenBy) {
					p.Stale += n
					continue
				}
				pg := false
				for _, o := range in.Outages {
					pg = pg || (a.Recv.After(o.From.Add(-stale)) && p.Count.Before(o.To.Add(stale)))
				}
				if pg {
					p.Postgres += n
					continue
				}
				if sp, ok := open(a.Gateway, a.Sent, a.Recv); ok {
					// Owed to the counter until the gateway's next Redis decision of the
					// key in the same process (a debt dies with its process).
					l, _ := lifeOf(a.Gateway, sp.From)
					same := func(b quotaAdm) bool {
						return b.Gateway == a.Gateway && !b.Sent.Before(l.From) && (!l.Stopped || !b.Sent.After(l.To))
					}
					if !decided(same, sp.To, seenBy) {
						p.Fallback += n
						continue
					}
				}
				restart := false
				for _, r := range in.RedisKills[a.region] {
					restart = restart || (a.Recv.After(r.From.Add(-stale)) && !a.Sent.After(r.To))
				}
				if restart {
					p.Restart += n
					continue
				}
				if l, ok := lifeOf(a.Gateway, a.Sent); ok && l.Stopped && a.Recv.After(l.To.Add(-report)) {
					region := a.region
					if !decided(func(b quotaAdm) bool { return b.region == region }, l.To, seenBy) {
						p.Stopped += n
					}
				}
			}
			// The boundary's admissions: what the previous period had no room for is
			// this one's; of the next boundary's, as many as fit here.
			p.Admitted, p.Ambiguous = own+carry, carry
			room := max(0, int(p.Bound())-p.Admitted)
			put := min(next, room)
			if i == len(periods)-1 {
				put = next
			}
			p.Admitted += put
			p.Ambiguous += put
			carry = next - put
			out = append(out, p)
		}
	}
	return out
}
