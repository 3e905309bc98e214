package faults

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
)

// sample is one gateway's process figures at one moment.
type sample struct {
	at                time.Duration // since the load started
	heap, rss, gorout float64
}

// Soak runs the two-region stack at a fixed rate for a long time with a fault injected
// every interval (the command line args: -duration, -every, -hold, -hot-rate, -calm-rate,
// -v), writes its report to out, and fails when memory or goroutines grew or any request
// got a 5xx. cmd/soak is its command.
func Soak(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	duration := fs.Duration("duration", 10*time.Minute, "how long to run the load (at least 3m)")
	every := fs.Duration("every", 45*time.Second, "a fault every this long")
	hold := fs.Duration("hold", 5*time.Second, "how long each fault lasts")
	hot := fs.Float64("hot-rate", 40, "hot tenant requests per second per gateway")
	calm := fs.Float64("calm-rate", 10, "calm tenant requests per second per gateway")
	verbose := fs.Bool("v", false, "log the stack's progress")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *duration < 3*time.Minute || *duration > 2*time.Hour {
		return fmt.Errorf("-duration %v: want 3m..2h", *duration)
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	fmt.Fprintf(out, "starting the stack ...\n")
	env, err := Start(ctx, Options{HotRate: *hot, CalmRate: *calm, Logger: logger})
	if err != nil {
		return err
	}
	defer env.Close()

	load := env.StartLoad(ctx, *duration+time.Minute)
	began := time.Now()
	samples := map[string][]sample{}
	sampleAll := func() {
		for _, g := range env.Gateways {
			s, err := ScrapeURL(ctx, g.Admin)
			if err != nil {
				continue
			}
			samples[g.ID] = append(samples[g.ID], sample{
				at: time.Since(began), heap: s.Sum("go_memstats_heap_inuse_bytes"),
				rss: s.Sum("process_resident_memory_bytes"), gorout: s.Sum("go_goroutines"),
			})
		}
	}
	plan := soakFaults(env, *hold)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	next, n := began.Add(*every), 0
	for time.Since(began) < *duration && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			sampleAll()
			if time.Now().After(next) && time.Until(began.Add(*duration)) > *every/2 {
				f := plan[n%len(plan)]
				n++
				start := time.Now()
				err := f.run(ctx)
				fmt.Fprintf(out, "%6s  %-40s %v\n", time.Since(began).Round(time.Second), f.name, errText(err, time.Since(start)))
				next = time.Now().Add(*every)
			}
		}
	}
	sampleAll()
	res, err := load.Stop()
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	codes := map[int]uint64{}
	var requests uint64
	for _, r := range res {
		for c, k := range r.Codes {
			codes[c] += k
			requests += k
		}
	}
	fmt.Fprintf(out, "\n%v of load, %d faults, %d requests: %v\n\n", *duration, n, requests, codes)
	return report(out, samples, codes)
}

// report prints minute one against the last minute per gateway and judges it.
func report(out io.Writer, samples map[string][]sample, codes map[int]uint64) error {
	var problems []string
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "gateway\theap in use min 1\tlast min\tratio\tRSS min 1\tlast min\tratio\tgoroutines min 1\tlast min\t")
	ids := make([]string, 0, len(samples))
	for id := range samples {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		ss := samples[id]
		last := ss[len(ss)-1].at
		first := median(ss, func(s sample) bool { return s.at >= 30*time.Second && s.at <= 90*time.Second })
		end := median(ss, func(s sample) bool { return s.at >= last-time.Minute })
		hr, rr := end.heap/first.heap, end.rss/first.rss
		fmt.Fprintf(tw, "%s\t%.1f MB\t%.1f MB\t%.2f\t%.1f MB\t%.1f MB\t%.2f\t%.0f\t%.0f\t\n", id,
			first.heap/1e6, end.heap/1e6, hr, first.rss/1e6, end.rss/1e6, rr, first.gorout, end.gorout)
		if hr > 1.2 || rr > 1.2 {
			problems = append(problems, fmt.Sprintf("%s: heap x%.2f, RSS x%.2f over the run (want <= 1.2)", id, hr, rr))
		}
		if end.gorout > first.gorout*1.1+5 {
			problems = append(problems, fmt.Sprintf("%s: goroutines %.0f -> %.0f", id, first.gorout, end.gorout))
		}
	}
	_ = tw.Flush()
	var fives uint64
	for c, n := range codes {
		if c >= 500 {
			fives += n
		}
	}
	if fives > 0 {
		problems = append(problems, fmt.Sprintf("%d responses with status 5xx", fives))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Fprintln(out, "\nok: memory and goroutines flat, no 5xx")
	return nil
}

// median is the per-field median of the samples that keep selects (medians damp GC
// sawtooth and scrape timing).
func median(ss []sample, keep func(sample) bool) sample {
	var h, r, g []float64
	for _, s := range ss {
		if keep(s) {
			h, r, g = append(h, s.heap), append(r, s.rss), append(g, s.gorout)
		}
	}
	mid := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return sample{heap: mid(h), rss: mid(r), gorout: mid(g)}
}

func errText(err error, took time.Duration) string {
	if err != nil {
		return "FAILED: " + err.Error()
	}
	return "healed after " + took.Round(100*time.Millisecond).String()
}

type soakFault struct {
	name string
	run  func(ctx context.Context) error
}

// soakFaults are the faults the soak rotates through. Gateway restarts are left out:
// they would reset the very figures the soak watches.
func soakFaults(env *Env, hold time.Duration) []soakFault {
	wait := func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
	}
	east, west := env.Regions[0], env.Regions[1]
	redis := env.Redis[east]
	return []soakFault{
		{"redis killed, back empty (" + east + ")", func(ctx context.Context) error {
			if err := redis.Kill(); err != nil {
				return err
			}
			wait(ctx)
			return redis.Restart(ctx)
		}},
		{"redis paused (" + east + ")", func(ctx context.Context) error {
			if err := redis.Pause(); err != nil {
				return err
			}
			wait(ctx)
			return redis.Resume()
		}},
		{"redis slowed 20 ms (" + east + ")", func(ctx context.Context) error {
			env.Proxies.Get(east).SetDelay(20 * time.Millisecond)
			wait(ctx)
			env.Proxies.Get(east).SetDelay(0)
			return nil
		}},
		{"postgresql killed", func(ctx context.Context) error {
			if err := env.Postgres.Kill(); err != nil {
				return err
			}
			wait(ctx)
			return env.Postgres.Restart(ctx)
		}},
		{"prometheus down", func(ctx context.Context) error {
			if err := env.Prometheus.Stop(); err != nil {
				return err
			}
			wait(ctx)
			return env.Prometheus.Restart(ctx)
		}},
		{"scrape gap (" + west + ")", func(ctx context.Context) error {
			jobs := env.ScrapeJobs()
			gap := env.ScrapeJobs()
			for i := range gap {
				var keep []testenv.TargetGroup
				for _, g := range gap[i].Groups {
					if g.Labels["region"] != west {
						keep = append(keep, g)
					}
				}
				gap[i].Groups = keep
			}
			if err := env.Prometheus.SetJobs(ctx, gap); err != nil {
				return err
			}
			wait(ctx)
			return env.Prometheus.SetJobs(ctx, jobs)
		}},
		{"redis restarted empty (" + west + ")", func(ctx context.Context) error {
			return env.Redis[west].Restart(ctx)
		}},
	}
}
