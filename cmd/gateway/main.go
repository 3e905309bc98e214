package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/gateway"
	"github.com/quotaplane/quotaplane/internal/healthcheck"
	"github.com/quotaplane/quotaplane/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.LookupEnv); err != nil {
		stop()
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // --help: the usage is printed, and asking for it is no failure
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// run parses the flags, loads the configuration and runs the gateway until ctx ends.
// lookupEnv is os.LookupEnv: a URL variable that is set but empty is refused, not read
// as "no database" or "no Redis".
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool)) error {
	if len(args) > 0 && args[0] == healthcheck.Name {
		// `gateway healthcheck [URL]`: for images without a shell (compose.yaml).
		return healthcheck.Run(ctx, "gateway", args[1:], "http://"+gateway.DefaultAdminListen+"/readyz", os.Stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	configPath := fs.String("config", "", "configuration file (YAML; see docs/configuration.md)")
	listen := fs.String("listen", "", "proxy address host:port (overrides listen)")
	region := fs.String("region", "", "region name (overrides region)")
	check := fs.Bool("check", false, "validate the configuration and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, "gateway", version.Get())
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *configPath == "" {
		return errors.New("--config FILE is required")
	}
	ov := gateway.OverridesFromLookupEnv(lookupEnv)
	ov.Listen, ov.Region = *listen, *region
	cfg, err := gateway.LoadConfig(*configPath, ov)
	if err != nil {
		return err
	}
	log := newLogger(os.Stderr, cfg.LogLevel)
	// go-redis logs pool failures (dials, TLS) on its own; keep them in the JSON log.
	redis.SetLogger(redisLogger{log})

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), version.Get().Collector())
	g, err := gateway.New(cfg, gateway.Options{Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(os.Stdout, "config %s: ok (mode %s, %s)\n", *configPath, cfg.Mode, cfg.ModeSource())
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
