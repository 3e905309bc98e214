package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/version"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/job"
	"github.com/quotaplane/quotaplane/rebalancer/status"
	"github.com/quotaplane/quotaplane/regions"
	"github.com/quotaplane/quotaplane/regions/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stderr)
	stop()
	os.Exit(cliflag.Exit(os.Stderr, "rebalancer", err)) // 2 for a usage error, 1 for any other
}

// The environment variables behind --database-url and --prometheus-url: the names every
// binary reads (internal/cliflag).
const (
	EnvDatabaseURL   = cliflag.EnvDatabaseURL
	EnvPrometheusURL = cliflag.EnvPrometheusURL
)

// defaultAdminListen is --admin-listen's default, and where `rebalancer healthcheck` looks.
const defaultAdminListen = "127.0.0.1:9102"

// options are the rebalancer's flags, filled from the environment and validated by resolve.
type options struct {
	databaseURL   string
	prometheus    []string // --prometheus-url values: one URL, or REGION=URL each
	interval      time.Duration
	checkInterval time.Duration
	shortWindow   time.Duration
	reloadWait    time.Duration
	instanceTTL   time.Duration
	expireAfter   int // full runs; -1 never
	leaderTimeout time.Duration
	once, dryRun  bool
	adminListen   string
	logLevel      string
}

// sessionTimeout is --leader-timeout, or its default: the leader uses its lock connection
// before every tick, at most the shorter interval plus a tick's duration apart.
func (o options) sessionTimeout() time.Duration {
	if o.leaderTimeout > 0 {
		return o.leaderTimeout
	}
	return max(2*o.tickEvery()+o.reloadWait+10*time.Second, time.Second)
}

// tickEvery is the shorter of --interval and --check-interval: the longest a leader goes
// between two uses of its lock connection, but for a tick's own duration.
func (o options) tickEvery() time.Duration {
	every := o.interval
	if o.checkInterval > 0 && o.checkInterval < every {
		every = o.checkInterval
	}
	return every
}

// newRootCmd is `rebalancer [flags]` with its `version` and `healthcheck` subcommands; it
// calls serve with the validated options.
func newRootCmd(lookupEnv func(string) (string, bool), serve func(context.Context, options) error) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "rebalancer --prometheus-url URL [--database-url URL] [flags]",
		Short: "Rewrite the regions' shares of every global limit from their demand",
		Long: `rebalancer reads offered demand per region from Prometheus every --interval and
rewrites the regions' shares of every global limit in PostgreSQL (docs/rebalancer.md).
Only the replica holding the leader lock acts. Durations take days too: 90s, 5m, 1d12h.
Exit codes: 0 success, 1 failed, 2 a bad flag or argument.`,
		Args:                  cliflag.NoArgs,
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.resolve(cmd, lookupEnv); err != nil {
				return err
			}
			return serve(cmd.Context(), o)
		},
	}
	build := version.Get()
	cliflag.Configure(root, "rebalancer", build)
	fs := root.Flags()
	// The defaults are read after parsing, so --help never prints a password.
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default $"+EnvDatabaseURL+")")
	fs.StringArrayVar(&o.prometheus, "prometheus-url", nil, "Prometheus base URL; or repeat as region=URL for one Prometheus per region (default $"+EnvPrometheusURL+", comma-separated for several)")
	cliflag.DurationVar(fs, &o.interval, "interval", job.DefaultInterval, "full run period; also the long rate window")
	cliflag.DurationVar(fs, &o.checkInterval, "check-interval", job.DefaultCheckInterval, "fast-path check period")
	cliflag.DurationVar(fs, &o.shortWindow, "short-window", demand.DefaultShortWindow, "short rate window (fast path, peak reserve)")
	cliflag.DurationVar(fs, &o.reloadWait, "reload-wait", job.DefaultReloadWait, "pause between writing share decreases and increases (one gateway reload)")
	cliflag.DurationVar(fs, &o.instanceTTL, "instance-ttl", job.DefaultInstanceTTL, "a gateway unseen for longer is not live; a region with none is dark")
	fs.IntVar(&o.expireAfter, "expire-after-runs", job.DefaultExpireAfterRuns, "delete a tenant/route pair's rebalancer shares after this many full runs without its demand (history reason \"expired\"); -1 never")
	cliflag.DurationVar(fs, &o.leaderTimeout, "leader-timeout", 0, "a leader that has not used its lock connection for this long (stopped, cut off) loses its session and the lock; another replica takes over within this plus one check interval (default: 2 x the shorter of --interval and --check-interval, plus --reload-wait, plus 10s)")
	fs.BoolVar(&o.once, "once", false, "run once and exit: takes the leader lock (fails while another rebalancer holds it); non-zero if the run was skipped")
	fs.BoolVar(&o.dryRun, "dry-run", false, "compute and log the shares, write nothing")
	fs.StringVar(&o.adminListen, "admin-listen", defaultAdminListen, "admin address for /metrics, /healthz, /readyz and the status page (/ and /status.json); empty disables it")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	root.AddCommand(
		cliflag.VersionCmd("rebalancer", build),
		// `rebalancer healthcheck [URL]`: for images without a shell (compose.yaml).
		cliflag.HealthcheckCmd("rebalancer", "http://"+defaultAdminListen+"/readyz"),
	)
	cliflag.AddEnvHelp(root, "a flag wins over its variable; set but empty is refused",
		cliflag.Var{Name: EnvDatabaseURL, Sets: "--database-url"},
		cliflag.Var{Name: EnvPrometheusURL, Sets: "--prometheus-url, comma-separated REGION=URL for several"},
	)
	return root
}

// envURL reads the variable behind a URL flag: set but empty is refused (an unfilled
// Secret), so the operator hears that, rather than "required".
func envURL(lookupEnv func(string) (string, bool), name, what, flag string) (string, error) {
	v, set := lookupEnv(name)
	if set && strings.TrimSpace(v) == "" {
		return "", cliflag.Usagef("$%s is set but empty: give the %s URL (or %s)", name, what, flag)
	}
	return v, nil
}

// resolve fills the URLs not given as flags from the environment and validates o; every
// error is a usage error naming the flag.
func (o *options) resolve(cmd *cobra.Command, lookupEnv func(string) (string, bool)) error {
	if !cmd.Flags().Changed("database-url") {
		v, err := envURL(lookupEnv, EnvDatabaseURL, "PostgreSQL", "--database-url")
		if err != nil {
			return err
		}
		o.databaseURL = v
	}
	if !cmd.Flags().Changed("prometheus-url") {
		v, err := envURL(lookupEnv, EnvPrometheusURL, "Prometheus", "--prometheus-url")
		if err != nil {
			return err
		}
		if v != "" {
			o.prometheus = strings.Split(v, ",")
		}
	}
	switch {
	case o.databaseURL == "":
		return cliflag.Usagef("--database-url (or $%s) is required", EnvDatabaseURL)
	case len(o.prometheus) == 0:
		return cliflag.Usagef("--prometheus-url (or $%s) is required", EnvPrometheusURL)
	case o.interval < time.Second:
		return cliflag.Usagef("--interval %s: must be at least 1s", o.interval)
	case o.checkInterval <= 0:
		return cliflag.Usagef("--check-interval %s: must be > 0", o.checkInterval)
	case o.leaderTimeout != 0 && o.leaderTimeout < time.Second:
		return cliflag.Usagef("--leader-timeout %s: must be at least 1s (or 0 for the default)", o.leaderTimeout)
	case o.reloadWait <= 0 || o.instanceTTL <= 0 || o.shortWindow < time.Second:
		return cliflag.Usagef("--reload-wait and --instance-ttl must be > 0, --short-window at least 1s")
	case o.leaderTimeout != 0 && o.leaderTimeout <= o.tickEvery()+o.reloadWait:
		// The leader uses its lock connection before every tick: a session timeout that
		// elapses between two ticks ends the session, and the lock, every time.
		return cliflag.Usagef("--leader-timeout %s: must be longer than the shorter of --interval and --check-interval (%s) plus --reload-wait (%s), or the leader loses its lock between two ticks",
			o.leaderTimeout, o.tickEvery(), o.reloadWait)
	case o.expireAfter < 1 && o.expireAfter != -1:
		return cliflag.Usagef("--expire-after-runs %d: must be at least 1, or -1 to never expire", o.expireAfter)
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.logLevel)); err != nil {
		return cliflag.Usagef("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	return nil
}

// parseFlags is the command line's options, as the binary would run with them; flag
// errors go to stderr.
func parseFlags(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (options, error) {
	var got options
	err := cliflag.Execute(context.Background(), newRootCmd(lookupEnv, func(_ context.Context, o options) error {
		got = o
		return nil
	}), args, io.Discard, stderr)
	return got, err
}

// run parses the flags and runs the rebalancer until ctx ends (or once, with --once);
// --help, --version and the subcommands print on stdout. Logs (JSON) and flag errors go
// to stderr.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) error {
	return execute(ctx, args, lookupEnv, os.Stdout, stderr)
}

// execute is run with stdout given.
func execute(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	root := newRootCmd(lookupEnv, func(ctx context.Context, o options) error { return serve(ctx, o, stderr) })
	return cliflag.Execute(ctx, root, args, stdout, stderr)
}

// serve runs the rebalancer with o. PostgreSQL need not be up: the store is opened lazily
// and every tick retries (counted as skipped_database until it is back); only a malformed
// --database-url or --prometheus-url fails at start (a usage error).
func serve(ctx context.Context, o options, stderr io.Writer) error {
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.logLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	sources, err := demand.ParseSources(o.prometheus)
	if err != nil {
		return cliflag.UsageError{Err: err}
	}
	reader, err := demand.New(demand.Config{Sources: sources, LongWindow: o.interval, ShortWindow: o.shortWindow})
	if err != nil {
		return err
	}
	// Open parses the URL (a malformed one is a configuration error) and dials nothing:
	// a database that is down fails each tick as skipped_database until it is back, and
	// the pool reconnects by itself.
	st, err := store.Open(ctx, o.databaseURL)
	if errors.Is(err, regions.ErrInvalid) {
		return cliflag.UsageError{Err: err}
	} else if err != nil {
		return err
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
	cfg := job.Config{
		Interval: o.interval, CheckInterval: o.checkInterval, ReloadWait: o.reloadWait,
		InstanceTTL: o.instanceTTL, ExpireAfterRuns: o.expireAfter, DryRun: o.dryRun, Logger: log, Registerer: reg,
	}
	var elector *job.Elector
	if !o.dryRun { // a dry run writes nothing, so it needs no lock and takes none
		if elector, err = job.NewElector(job.ElectorConfig{DatabaseURL: o.databaseURL, Logger: log, SessionTimeout: o.sessionTimeout()}); err != nil {
			return err
		}
		defer elector.Close()
		cfg.Elector = elector
	}
	j, err := job.New(cfg, st, reader)
	if err != nil {
		return err
	}

	if o.once {
		if elector != nil {
			if err := elector.IsLeader(ctx); err != nil {
				return fmt.Errorf("--once: %w", err)
			}
		}
		_, err := j.RunOnce(ctx)
		return err
	}

	var srv *http.Server
	srvDone := make(chan error, 1)
	if o.adminListen != "" {
		ln, err := net.Listen("tcp", o.adminListen)
		if err != nil {
			return fmt.Errorf("--admin-listen %s: %w", o.adminListen, err)
		}
		page, err := statusPage(sources, o, st, j, log)
		if err != nil {
			ln.Close()
			return err
		}
		srv = &http.Server{Handler: adminMux(reg, page, st), ReadHeaderTimeout: 5 * time.Second}
		go func() { srvDone <- srv.Serve(ln) }()
		log.Info("admin listening", "addr", ln.Addr().String())
	}
	log.Info("rebalancer started", "interval", o.interval.String(), "check_interval", o.checkInterval.String(),
		"prometheus", sourcesString(sources), "database", store.RedactURL(o.databaseURL), "expire_after_runs", o.expireAfter, "dry_run", o.dryRun)
	runErr := j.Run(ctx)
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		if err := <-srvDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server failed", "err", err)
		}
	}
	log.Info("rebalancer stopped")
	return runErr
}

// sourcesString lists the Prometheus sources for the log, passwords hidden.
func sourcesString(sources []demand.Source) string {
	out := make([]string, len(sources))
	for i, s := range sources {
		out[i] = s.String()
	}
	return strings.Join(out, ",")
}

// statusPage is the status page over the store and the same Prometheus servers the
// demand is read from.
func statusPage(sources []demand.Source, o options, store status.Store, j *job.Job, log *slog.Logger) (http.Handler, error) {
	var proms []status.Source
	for _, s := range sources {
		p, err := s.API(nil) // a URL parse error, ruled out by demand.ParseSources
		if err != nil {
			return nil, fmt.Errorf("status page: %w", err)
		}
		proms = append(proms, status.Source{Region: s.Region, API: p})
	}
	return status.New(status.Config{Prometheus: proms, InstanceTTL: o.instanceTTL, LastRun: j.Last, StaleAfter: j.StaleAfter(), Logger: log}, store)
}

// adminMux serves /metrics, /healthz, /readyz (the database answers with a region row)
// and, at "/", the status page (its /status.json and /assets/ included).
func adminMux(g prometheus.Gatherer, page http.Handler, st regionLister) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /readyz", readyHandler(st))
	mux.Handle("GET /", page)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
