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

	"github.com/quotaplane/quotaplane/gateway"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gateway:", err)
		}
		stop()
		os.Exit(1)
	}
}

// run parses the flags, loads the configuration and runs the gateway until ctx ends.
func run(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	configPath := fs.String("config", "", "configuration file (YAML; see docs/configuration.md)")
	listen := fs.String("listen", "", "proxy address host:port (overrides listen)")
	region := fs.String("region", "", "region name (overrides region)")
	check := fs.Bool("check", false, "validate the configuration and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *configPath == "" {
		return errors.New("--config FILE is required")
	}
	ov := gateway.OverridesFromEnv(getenv)
	ov.Listen, ov.Region = *listen, *region
	cfg, err := gateway.LoadConfig(*configPath, ov)
	if err != nil {
		return err
	}
	log := newLogger(os.Stderr, cfg.LogLevel)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g, err := gateway.New(cfg, gateway.Options{Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	if *check {
		fmt.Fprintf(os.Stdout, "config %s: ok\n", *configPath)
		return nil
	}
	return g.Run(ctx)
}

// newLogger logs JSON at level (already validated by LoadConfig).
func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l}))
}
