package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/quotaplane/quotaplane/gateway"
	"github.com/quotaplane/quotaplane/internal/testenv"
)

// The benchmark binary is also its own child processes: the echo upstream, and a gateway
// with a pprof listener. The parent selects one with these variables.
const (
	envChild    = "QUOTAPLANE_BENCH_CHILD"    // "echo", "proxy" or "gateway"
	envListen   = "QUOTAPLANE_BENCH_LISTEN"   // echo, proxy: the address to serve on; gateway: the pprof address
	envConfig   = "QUOTAPLANE_BENCH_CONFIG"   // gateway: its configuration file
	envUpstream = "QUOTAPLANE_BENCH_UPSTREAM" // proxy: the upstream's base URL
)

// runChild runs one child until SIGTERM.
func runChild(kind string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch kind {
	case "echo":
		return serveUntil(ctx, os.Getenv(envListen), http.HandlerFunc(echo))
	case "proxy":
		h, err := bareProxy(os.Getenv(envUpstream))
		if err != nil {
			return err
		}
		return serveUntil(ctx, os.Getenv(envListen), h)
	case "gateway":
		return profiledGateway(ctx, os.Getenv(envConfig), os.Getenv(envListen))
	}
	return fmt.Errorf("%s=%q: want echo, proxy or gateway", envChild, kind)
}

// bareProxy is the standard library's reverse proxy to upstream and nothing else: the
// floor a gateway's own work is measured against. It is configured as the gateway
// configures its proxy (gateway/handler.go: a transport with 1,024 idle connections,
// 256 per host; pooled 32 KB copy buffers), so that the two differ only in what the
// gateway does around the proxy.
func bareProxy(upstream string) (http.Handler, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("%s=%q: not an upstream URL", envUpstream, upstream)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 1024
	transport.MaxIdleConnsPerHost = 256
	return &httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport:  transport,
		BufferPool: &proxyBuffers{},
	}, nil
}

// proxyBuffers is an httputil.BufferPool of 32 KB buffers.
type proxyBuffers struct{ pool sync.Pool }

func (p *proxyBuffers) Get() []byte {
	if b, ok := p.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, 32<<10)
}

func (p *proxyBuffers) Put(b []byte) { p.pool.Put(&b) }

// echo is the fast upstream: a small JSON answer, as e2e/stack's upstream gives.
func echo(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`+"\n")
}

func serveUntil(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// profiledGateway is cmd/gateway's run (the same configuration loading, registry and
// Run) plus net/http/pprof on its own loopback listener.
func profiledGateway(ctx context.Context, config, pprofAddr string) error {
	runtime.MemProfileRate = 512 << 10 // the runtime's default, whatever a test binary set
	cfg, err := gateway.LoadConfig(config, gateway.Overrides{})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := gateway.New(cfg, gateway.Options{Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	pctx, stopProf := context.WithCancel(ctx)
	defer stopProf()
	perr := make(chan error, 1)
	go func() { perr <- serveUntil(pctx, pprofAddr, mux) }()
	runErr := g.Run(ctx)
	stopProf()
	if err := <-perr; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// startChild runs this program as a child of the given kind, ready when url answers.
func (b *bench) startChild(ctx context.Context, kind, name string, port int, ready string, env ...string) (*testenv.Process, error) {
	dir := filepath.Join(b.work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := testenv.StartCommand(ctx, testenv.Command{
		Name: name, Path: b.self, Dir: dir, Port: port,
		Env:   append([]string{envChild + "=" + kind}, env...),
		Ready: testenv.HTTPReady(ready),
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// startProxy starts the bare reverse proxy to upstream and returns it with its base URL.
func (b *bench) startProxy(ctx context.Context, name, upstream string) (*testenv.Process, string, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, "", err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	p, err := b.startChild(ctx, "proxy", name, port, base+"/", envListen+"=127.0.0.1:"+strconv.Itoa(port), envUpstream+"="+upstream)
	return p, base, err
}

// startEcho starts the echo upstream and returns it with its base URL.
func (b *bench) startEcho(ctx context.Context, name string) (*testenv.Process, string, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, "", err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	p, err := b.startChild(ctx, "echo", name, port, url+"/", envListen+"=127.0.0.1:"+strconv.Itoa(port))
	return p, url, err
}
