// Command demo runs the local two-region stack (e2e/stack) with a load generator and a
// live table of one tenant's traffic per region: `make demo`, or `make demo DURATION=60s`
// to run unattended and exit with a summary of whether that tenant's shares followed its
// demand. Ctrl-C stops it (and the stack) with exit status 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/quotaplane/quotaplane/e2e/loadgen"
	"github.com/quotaplane/quotaplane/e2e/stack"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/regions"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case interrupted:
		// Ctrl-C (or SIGTERM) is how a person ends the demo, not a failure: whatever was
		// still starting or running is stopped and removed by now.
		fmt.Fprintln(os.Stdout, "demo: stopped; the stack is shut down and its data removed")
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// shifting is the tenant whose traffic moves from 70/30 to 30/70 halfway.
const shifting = "shop-a"

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 0, "run unattended for this long, then print a summary and exit (0 = until Ctrl-C, at most 30m)")
	interval := fs.Duration("interval", 10*time.Second, "rebalancer interval")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *duration < 0 || *duration > loadgen.MaxDuration {
		return fmt.Errorf("--duration %v: must be between 0 and %v", *duration, loadgen.MaxDuration)
	}
	load := *duration
	if load == 0 {
		load = loadgen.MaxDuration
	}
	half := load / 2
	if *duration == 0 {
		half = 2 * time.Minute
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fmt.Fprintln(out, "starting the two-region stack (PostgreSQL, 2 Redis, 4 gateways, Prometheus, rebalancer); Ctrl-C stops it...")
	s, err := stack.Start(ctx, stack.Options{RebalanceInterval: *interval, Logger: log})
	if err != nil {
		return err
	}
	defer s.Close()
	printWhere(out, s)
	printStory(out, s, half, *interval)

	streams := demoLoad(s, half)
	live := &loadgen.Counts{}
	loadDone := make(chan error, 1)
	go func() {
		_, err := loadgen.Run(ctx, streams, load, live)
		loadDone <- err
	}()

	prom, err := promapi.NewClient(promapi.Config{Address: s.Prometheus.URL()})
	if err != nil {
		return err
	}
	api := promv1.NewAPI(prom)
	start := time.Now()
	var phase1 float64 // shifting tenant's us-east share at the end of phase one
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\nstopping...")
			<-loadDone
			return ctx.Err()
		case err := <-loadDone:
			if ctx.Err() != nil { // interrupted: the load stopped because of it
				fmt.Fprintln(out, "\nstopping...")
				return ctx.Err()
			}
			if err != nil {
				return err
			}
			return summary(ctx, out, s, phase1)
		case <-tick.C:
			el := time.Since(start)
			if el < half {
				phase1 = share(ctx, s, s.Regions[0])
			}
			printTable(ctx, out, s, api, el, el >= half)
		}
	}
}

// demoLoad: shop-a sends 150 rps (1.5x its limit) 70/30 then 30/70; shop-b 80 rps split
// evenly (under its limit); shop-c 60 rps in the first region only (3x its limit).
func demoLoad(s *stack.Stack, half time.Duration) []loadgen.Stream {
	a, b := s.Regions[0], s.Regions[1]
	regionRate := map[string]map[string]func(time.Duration) float64{
		a: {
			"shop-a": loadgen.Steps([]time.Duration{half}, []float64{105, 45}),
			"shop-b": loadgen.Constant(40),
			"shop-c": loadgen.Constant(60),
		},
		b: {
			"shop-a": loadgen.Steps([]time.Duration{half}, []float64{45, 105}),
			"shop-b": loadgen.Constant(40),
		},
	}
	var out []loadgen.Stream
	for region, tenants := range regionRate {
		gws := s.GatewaysOf(region)
		for tenant, rate := range tenants {
			for _, g := range gws {
				n := float64(len(gws))
				out = append(out, loadgen.Stream{
					Name: region + "/" + tenant + "/" + g.ID, Method: http.MethodPost, URL: g.URL + "/orders",
					Header: http.Header{"X-Api-Key": []string{s.Keys[tenant]}},
					Rate:   func(e time.Duration) float64 { return rate(e) / n },
				})
			}
		}
	}
	return out
}

func printWhere(out io.Writer, s *stack.Stack) {
	fmt.Fprintf(out, "\nPrometheus:   %s\nstatus page:  %s/\nratectl:      go run ./cmd/ratectl --database-url '%s' --prometheus-url %s status\n",
		s.Prometheus.URL(), s.RebalancerAdmin, s.DatabaseURL, s.Prometheus.URL())
	for _, g := range s.Gateways {
		fmt.Fprintf(out, "gateway %-10s %s (admin %s)\n", g.ID, g.URL, g.Admin)
	}
	fmt.Fprintf(out, "%s\n\n", tryLine(s.Keys, s.Gateways[0].URL))
}

// tryLine is a request to paste, with the key of the tenant the table follows, so that it
// counts in the table's figures.
func tryLine(keys map[string]string, gateway string) string {
	return fmt.Sprintf("try:          curl -i -X POST -H 'X-Api-Key: %s' %s/orders   # as %s", keys[shifting], gateway, shifting)
}

// printStory says what the load is and what the table shows, before the first table.
func printStory(out io.Writer, s *stack.Stack, half, interval time.Duration) {
	limit := followedRule().RefillPerSecond
	a, b := s.Regions[0], s.Regions[1]
	fmt.Fprintf(out, `The table follows tenant %[1]s: %.0f requests/s, 1.5x its global limit of %.0f/s,
70%% to %[4]s and 30%% to %[5]s, turning to 30/70 after %[6]s. Every %[7]s the rebalancer
moves %[1]s's shares of its limit towards where its demand is. Columns: %[1]s's own requests
per region (offered = allowed + throttled, rates over the last 10s, so they follow the
load a few seconds late), its share, and the regional limit that share gives (limit x
share): allowed/s settles at limit/s. Two other tenants send load too; they are not in
the table.

`, shifting, 1.5*limit, limit, a, b, half.Round(time.Second), interval)
}

// followedRule is the rule of the tenant the table follows.
func followedRule() stack.Tenant {
	for _, t := range stack.DemoTenants() {
		if t.ID == shifting {
			return t
		}
	}
	return stack.Tenant{ID: shifting}
}

func share(ctx context.Context, s *stack.Stack, region string) float64 {
	snap, err := s.Store.LoadSnapshot(ctx, 3*time.Second)
	if err != nil {
		return -1
	}
	v, _ := snap.Share(region, shifting, stack.Route)
	return v
}

func printTable(ctx context.Context, out io.Writer, s *stack.Stack, api promv1.API, el time.Duration, shifted bool) {
	// The rebalancer's own per-tenant offered-demand query, for the followed tenant only,
	// so the table shows what the rebalancer acts on for it; a failed query shows zeros,
	// as the table is only a live view.
	rates := map[string]demand.Rates{}
	if v, _, _, err := api.Query(ctx, demand.TenantOfferedQuery(10*time.Second, "", shifting), time.Now()); err == nil {
		if vec, ok := v.(model.Vector); ok {
			for _, smp := range vec {
				region := string(smp.Metric["region"])
				r := rates[region]
				r.Add(string(smp.Metric["decision"]), float64(smp.Value))
				rates[region] = r
			}
		}
	}
	snap, _ := s.Store.LoadSnapshot(ctx, 3*time.Second)
	phase := "70/30"
	if shifted {
		phase = "30/70"
	}
	fmt.Fprintf(out, "t=%-4s  %s's demand %s %s/%s\n", el.Truncate(time.Second), shifting, phase, s.Regions[0], s.Regions[1])
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\toffered/s\tallowed/s\tthrottled/s\tshare\tlimit/s\tshare from\t")
	for _, r := range s.Regions {
		sh, src, limit := 0.0, regions.Source("?"), 0.0
		if snap != nil {
			_, l, v := snap.RegionalRule(r, shifting, stack.Route)
			_, src = snap.Share(r, shifting, stack.Route)
			sh, limit = v, l.RefillPerSecond
		}
		rt := rates[r]
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.3f\t%.1f\t%s\t\n", r, rt.Offered(), rt.Allowed, rt.Throttled, sh, limit, src)
	}
	_ = tw.Flush()
	if len(rates) == 0 {
		fmt.Fprintln(out, "(no samples yet: Prometheus needs two scrapes for a rate)")
	}
	fmt.Fprintln(out)
}

// summary says whether the shifting tenant's shares followed its demand: the first region
// led (share > 0.55) while it had 70% of the demand, and trailed (< 0.45) after the shift.
func summary(ctx context.Context, out io.Writer, s *stack.Stack, phase1 float64) error {
	final := share(ctx, s, s.Regions[0])
	fmt.Fprintf(out, "summary: %s share of %s: %.3f with 70%% of the demand, %.3f after the shift to 30%%\n", s.Regions[0], shifting, phase1, final)
	if phase1 > 0.55 && final < 0.45 {
		fmt.Fprintln(out, "summary: the shares followed the demand")
		return nil
	}
	return errors.New("the shares did not follow the demand (see the table above)")
}
