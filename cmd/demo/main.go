// Command demo runs the local two-region stack (e2e/stack) with a load generator and a
// live per-region table: `make demo`, or `make demo DURATION=60s` to run unattended and
// exit with a summary of whether the shares followed the demand.
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
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
		stop()
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
	fmt.Fprintln(out, "starting the two-region stack (PostgreSQL, 2 Redis, 4 gateways, Prometheus, rebalancer)...")
	s, err := stack.Start(ctx, stack.Options{RebalanceInterval: *interval, Logger: log})
	if err != nil {
		return err
	}
	defer s.Close()
	printWhere(out, s)

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
			return nil
		case err := <-loadDone:
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
	fmt.Fprintf(out, "try:          curl -i -X POST -H 'X-Api-Key: %s' %s/orders\n\n", s.Keys["shop-b"], s.Gateways[0].URL)
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
	// The rebalancer's own offered-demand query, so the table shows what it acts on;
	// a failed query shows zeros, as the table is only a live view.
	rates := map[string]demand.Rates{}
	if v, _, _, err := api.Query(ctx, demand.RegionOfferedQuery(10*time.Second, ""), time.Now()); err == nil {
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
	fmt.Fprintf(out, "t=%-4s  %s demand %s\n", el.Truncate(time.Second), shifting, phase)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\toffered/s\tallowed/s\tthrottled/s\tshare "+shifting+"\tsource\tdefault share\t")
	for _, r := range s.Regions {
		sh, src, def := 0.0, regions.Source("?"), 0.0
		if snap != nil {
			sh, src = snap.Share(r, shifting, stack.Route)
			def, _ = snap.Share(r, regions.Wildcard, regions.Wildcard)
		}
		rt := rates[r]
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.3f\t%s\t%.3f\t\n", r, rt.Offered(), rt.Allowed, rt.Throttled, sh, src, def)
	}
	_ = tw.Flush()
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
