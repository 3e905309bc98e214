package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/rebalancer/sim"
)

type simOptions struct {
	trace         string
	policies      []string
	interval      time.Duration
	checkInterval time.Duration
	capacity      int64
	refill        float64
}

func newSimCmd(a *app) *cobra.Command {
	def := sim.DefaultConfig()
	var o simOptions
	cmd := &cobra.Command{
		Use:   "sim --trace FILE [--policy P]... [--interval 5m] [--capacity N --refill X]",
		Short: "Replay a demand trace through the rebalancer's allocation code and compare policies",
		Long: `Replay a demand trace (CSV: time_seconds,region,tenant,offered_rps; "-" reads stdin)
through the production allocation code and baseline policies, in 1 s steps with one
token bucket per tenant per region, a 30 s scrape lag and a 20 s apply delay, and report
per policy: utilisation, over-admission (run and worst minute), unnecessary throttling
(run and worst region), convergence after each event, and share writes.

Comment lines may say "# untracked,TENANT,..." (tenants without a scope of their own:
they follow "*", split from their summed demand as the rebalancer does) and
"# region-added,T,REGION" / "# region-removed,T,REGION" (a region absent before T, or
after it).

Policies: waterfill, proportional-offered, proportional-allowed, static[:s1,s2,...]
(shares in the trace's region order). Without --policy: all of them, static 0.7/0.3
for two regions (the equal split otherwise). Nothing is read from or written to the
database.`,
		Example: `  ratectl sim --trace flash-crowd.csv
  ratectl sim --trace steady.csv --policy waterfill --policy static:0.5,0.5 -o json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error { return a.sim(cmd, o) }),
	}
	f := cmd.Flags()
	f.StringVar(&o.trace, "trace", "", `the trace file ("-": standard input) (required)`)
	f.StringArrayVar(&o.policies, "policy", nil, "a policy to simulate; repeat for several (default: compare all)")
	o.interval, o.checkInterval = def.Interval, def.CheckInterval
	f.Var((*durationValue)(&o.interval), "interval", "the rebalancer's full-run interval")
	f.Var((*durationValue)(&o.checkInterval), "check-interval", "the rebalancer's fast-path check interval (waterfill)")
	f.Int64Var(&o.capacity, "capacity", def.Capacity, "every tenant's global capacity (burst)")
	f.Float64Var(&o.refill, "refill", def.Refill, "every tenant's global refill per second")
	_ = cmd.MarkFlagRequired("trace")
	_ = cmd.MarkFlagFilename("trace", "csv")
	return cmd
}

func (a *app) sim(cmd *cobra.Command, o simOptions) error {
	if err := checkPositiveInt("capacity", o.capacity); err != nil {
		return err
	}
	if err := checkPositiveFloat("refill", o.refill); err != nil {
		return err
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"interval", o.interval}, {"check-interval", o.checkInterval}} {
		if d.v < time.Second || d.v%time.Second != 0 || d.v > 24*time.Hour {
			return usagef("--%s %v: must be whole seconds between 1s and 24h", d.flag, d.v)
		}
	}
	var policies []sim.Policy
	for _, s := range o.policies {
		p, err := sim.ParsePolicy(s)
		if err != nil {
			return usagef("--policy %q: %v", s, err)
		}
		policies = append(policies, p)
	}

	var r io.Reader = cmd.InOrStdin()
	name := "stdin"
	if o.trace != "-" {
		f, err := os.Open(o.trace)
		if err != nil {
			return usagef("--trace: %v", err)
		}
		defer f.Close()
		r, name = f, filepath.Base(o.trace)
	}
	trace, err := sim.ParseTrace(r)
	if err != nil {
		if errors.Is(err, sim.ErrTrace) {
			return usagef("trace %s: %v", name, err)
		}
		return fmt.Errorf("read trace %s: %w", name, err)
	}
	trace.Name = name
	if len(policies) == 0 {
		policies = sim.ComparePolicies(len(trace.Regions))
	}

	cfg := sim.DefaultConfig()
	cfg.Capacity, cfg.Refill = o.capacity, o.refill
	cfg.Interval, cfg.CheckInterval = o.interval, o.checkInterval
	reports := make([]sim.Report, 0, len(policies))
	for _, p := range policies {
		if err := cmd.Context().Err(); err != nil {
			return err
		}
		rep, err := sim.Run(trace, p, cfg)
		if err != nil {
			return fmt.Errorf("simulate %s on %s: %w", p, name, err)
		}
		reports = append(reports, rep)
	}
	return a.render(cmd, reports, func(w io.Writer) {
		if err := sim.WriteTable(w, reports); err != nil {
			fmt.Fprintf(w, "write table: %v\n", err)
		}
	})
}
