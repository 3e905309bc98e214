package results

// Lookups the targets and the templates share. Each returns nil when the run did not
// measure the row.

// Row is the engine row of mode at callers on keys ("hot" or "100k").
func (e *Engine) Row(keys string, callers int, mode string) *EngineRow {
	if e == nil {
		return nil
	}
	for _, g := range e.Groups {
		if g.Keys != keys {
			continue
		}
		for i, r := range g.Rows {
			if r.Callers == callers && r.Mode == mode {
				return &g.Rows[i]
			}
		}
	}
	return nil
}

// Rel is ours (pipelined) relative to the other rows at callers on keys.
func (e *Engine) Rel(keys string, callers int) *EngineRelative {
	if e == nil {
		return nil
	}
	for i, r := range e.Relative {
		if r.Keys == keys && r.Callers == callers {
			return &e.Relative[i]
		}
	}
	return nil
}

// Row is the script row named script.
func (s *Scripts) Row(script string) *ScriptRow {
	if s == nil {
		return nil
	}
	for i, r := range s.Rows {
		if r.Script == script {
			return &s.Rows[i]
		}
	}
	return nil
}

// Latency is path's row at rps.
func (o *Overhead) Latency(rps float64, path string) *LatencyRow {
	if o == nil {
		return nil
	}
	for _, r := range o.Rates {
		if r.RPS != rps {
			continue
		}
		for i, l := range r.Rows {
			if l.Path == path {
				return &r.Rows[i]
			}
		}
	}
	return nil
}

// MaxOf is path's throughput search.
func (o *Overhead) MaxOf(path string) *MaxRow {
	if o == nil {
		return nil
	}
	for i, m := range o.Max {
		if m.Path == path {
			return &o.Max[i]
		}
	}
	return nil
}

// PathOf is the path with key.
func (o *Overhead) PathOf(key string) *Path {
	if o == nil {
		return nil
	}
	for i, p := range o.Paths {
		if p.Key == key {
			return &o.Paths[i]
		}
	}
	return nil
}

// Row is server's row at callers.
func (r *RLS) Row(server string, callers int) *RLSRow {
	if r == nil {
		return nil
	}
	for i, x := range r.Rows {
		if x.Server == server && x.Callers == callers {
			return &r.Rows[i]
		}
	}
	return nil
}

// CallerCounts are the caller counts measured, in order.
func (r *RLS) CallerCounts() []int {
	var out []int
	for _, x := range r.Rows {
		seen := false
		for _, c := range out {
			seen = seen || c == x.Callers
		}
		if !seen {
			out = append(out, x.Callers)
		}
	}
	return out
}

// Ratio is quotaplane's decisions/s over envoyproxy/ratelimit's at callers (0: one of
// them is missing).
func (r *RLS) Ratio(callers int) float64 {
	q, e := r.Row("quotaplane", callers), r.Row("ratelimit", callers)
	if q == nil || e == nil || e.DecisionsPerS <= 0 {
		return 0
	}
	return q.DecisionsPerS / e.DecisionsPerS
}

// CheckRow is the check-endpoint row of path ("nginx" or "nginx+check").
func (c *CheckLoad) Row(path string) *CheckRow {
	if c == nil {
		return nil
	}
	for i, x := range c.Rows {
		if x.Path == path {
			return &c.Rows[i]
		}
	}
	return nil
}

// Shown is the highest sustained rate over the runs; a run in which no rate passed
// counts as 0 and shows as "< the lowest rate tried".
func (m MaxRow) Shown() string {
	return show(m.RPS, func(v float64) string {
		if v > 0 {
			return fmtInt(v)
		}
		return "< " + fmtInt(m.BelowRPS)
	})
}
