package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// NginxOptions configures StartNginx.
type NginxOptions struct {
	// Dir holds the generated configuration, logs, pid and temp files; empty means a new
	// temporary directory.
	Dir string
	// Port is the port the server blocks listen on, written for {{PORT}}; 0 picks a free one.
	Port int
	// HTTP is the contents of the http {} block: upstreams and server blocks. Every
	// {{PORT}} in it is replaced by Port.
	HTTP string
}

// StartNginx starts nginx (Debian's nginx-light is enough) in the foreground with a
// configuration generated in Dir (nginx -p Dir -c nginx.conf -g 'daemon off;'), and
// waits until it accepts connections on 127.0.0.1:Port. Logs go to Dir/nginx.log.
func StartNginx(ctx context.Context, opts NginxOptions) (*Process, error) {
	bin, err := lookBinary("nginx", "nginx-light", "/usr/sbin")
	if err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "quotaplane-nginx-*"); err != nil {
			return nil, fmt.Errorf("start nginx: %w", err)
		}
	}
	if opts.Port == 0 {
		if opts.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"logs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("start nginx: %w", err)
		}
	}
	// As root, workers would switch to nobody, who cannot enter a test's private temp dir.
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;\n"
	}
	conf := user + `worker_processes 1;
error_log stderr warn;
pid ` + filepath.Join(opts.Dir, "nginx.pid") + `;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
` + strings.ReplaceAll(opts.HTTP, "{{PORT}}", strconv.Itoa(opts.Port)) + `
}
`
	confPath := filepath.Join(opts.Dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	p := &Process{Name: "nginx", Host: "127.0.0.1", Port: opts.Port, Dir: opts.Dir, bin: bin}
	p.args = []string{"-p", opts.Dir + "/", "-c", confPath, "-g", "daemon off;"}
	p.ready = func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", p.Addr())
		if err != nil {
			return err
		}
		return c.Close()
	}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Nginx starts nginx for a test (StartNginx) and stops it when the test ends.
func Nginx(t testing.TB, opts NginxOptions) *Process {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	p, err := StartNginx(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}
