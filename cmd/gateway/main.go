package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/quotaplane/quotaplane/gateway"
	"github.com/quotaplane/quotaplane/internal/cliflag"
	"github.com/quotaplane/quotaplane/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	stop()
	os.Exit(cliflag.Exit(os.Stderr, "gateway", err)) // 2 for a usage error, 1 for any other
}

// options are the gateway's flags.
type options struct {
	configPath, listen, region string
	check                      bool
}

// run parses the command line, loads the configuration and runs the gateway until ctx
// ends; --help, --version and the subcommands print on stdout. lookupEnv is
// os.LookupEnv: a URL variable that is set but empty is refused, not read as "no
// database" or "no Redis".
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	return cliflag.Execute(ctx, newRootCmd(lookupEnv, stdout, stderr), args, stdout, stderr)
}

// newRootCmd is `gateway [flags]` with its `version` and `healthcheck` subcommands.
func newRootCmd(lookupEnv func(string) (string, bool), stdout, stderr io.Writer) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "gateway --config FILE [--listen ADDR] [--region NAME] [--check]",
		Short: "Run one region gateway: an authenticated, rate-limited reverse proxy",
		Long: `gateway runs one region gateway: an authenticated, rate-limited reverse proxy
(docs/configuration.md). Exit codes: 0 success, 1 failed, 2 a bad flag or argument.`,
		Args:                  cliflag.NoArgs,
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), o, lookupEnv, stdout, stderr)
		},
	}
	build := version.Get()
	cliflag.Configure(root, "gateway", build)
	f := root.Flags()
	f.StringVar(&o.configPath, "config", "", "configuration file (YAML; see docs/configuration.md)")
	f.StringVar(&o.listen, "listen", "", "proxy address host:port (overrides listen)")
	f.StringVar(&o.region, "region", "", "region name (overrides region)")
	f.BoolVar(&o.check, "check", false, "validate the configuration and exit")
	root.AddCommand(
		cliflag.VersionCmd("gateway", build),
		// `gateway healthcheck [URL]`: for images without a shell (compose.yaml).
		cliflag.HealthcheckCmd("gateway", "http://"+gateway.DefaultAdminListen+"/readyz"),
	)
	cliflag.AddEnvHelp(root, "they win over the --config file's values; set but empty is refused",
		cliflag.Var{Name: gateway.EnvDatabaseURL, Sets: "database_url: the control plane's PostgreSQL"},
		cliflag.Var{Name: gateway.EnvRedisURL, Sets: "redis.url: the region's Redis"},
	)
	return root
}

// serve loads the configuration and runs the gateway (or, with --check, validates it).
func serve(ctx context.Context, o options, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	if o.configPath == "" {
		return cliflag.Usagef("--config FILE is required")
	}
	ov := gateway.OverridesFromLookupEnv(lookupEnv)
	ov.Listen, ov.Region = o.listen, o.region
	cfg, err := gateway.LoadConfig(o.configPath, ov)
	if err != nil {
		return err
	}
	log := newLogger(stderr, cfg.LogLevel)
	// go-redis logs pool failures (dials, TLS) on its own; keep them in the JSON log.
	redis.SetLogger(redisLogger{log})

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
	g, err := gateway.New(cfg, gateway.Options{Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	if o.check {
		fmt.Fprintf(stdout, "config %s: ok (mode %s, %s)\n", o.configPath, cfg.Mode, cfg.ModeSource())
		return nil
	}
	return g.Run(ctx)
}

// redisLogger puts go-redis's own messages into the gateway's log at Warn level (they are
// connection failures, which the limiter also counts). go-redis never formats a URL or
// password into them.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "msg_detail", fmt.Sprintf(format, v...))
}

// newLogger logs JSON at level (already validated by LoadConfig).
func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
