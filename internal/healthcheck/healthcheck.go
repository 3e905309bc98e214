// Package healthcheck is the `healthcheck` subcommand of the gateway and the rebalancer:
// one HTTP GET of the binary's own health endpoint, exit status 0 on a 2xx answer and 1
// otherwise, so that a container runtime can check an image that has no shell and no curl
// (the images are FROM scratch). compose.yaml uses it as
//
//	healthcheck:
//	  test: ["CMD", "/usr/local/bin/gateway", "healthcheck"]
//
// Kubernetes needs none of this: its probes are httpGet. It imports nothing from this
// module.
package healthcheck

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Name is the subcommand's name: `gateway healthcheck`, `rebalancer healthcheck`.
const Name = "healthcheck"

// DefaultTimeout bounds one check, connection and answer together.
const DefaultTimeout = 2 * time.Second

// maxBody is how much of the answer's body the result line shows.
const maxBody = 200

// Run is `PROGRAM healthcheck [--timeout D] [URL]`: it GETs URL (defaultURL when none is
// given) and returns nil for a 2xx answer, having printed one line to stdout; otherwise an
// error that names the URL and the status or failure, with the first line of the body
// ("503 Service Unavailable: not ready: no snapshot loaded"). Redirects are answers, not
// followed; no proxy from the environment is used. --help returns flag.ErrHelp.
func Run(ctx context.Context, program string, args []string, defaultURL string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(program+" "+Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", DefaultTimeout, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s %s [--timeout D] [URL]\n\nGET URL (default %s); exit 0 on a 2xx answer, 1 otherwise.\n\n", program, Name, defaultURL)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	target := defaultURL
	switch fs.NArg() {
	case 0:
	case 1:
		target = fs.Arg(0)
	default:
		return fmt.Errorf("%s: one URL at most, got %q", Name, fs.Args())
	}
	if *timeout <= 0 {
		return fmt.Errorf("%s: --timeout %s: must be > 0", Name, *timeout)
	}
	line, err := Check(ctx, target, *timeout)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	fmt.Fprintln(stdout, line)
	return nil
}

// Check GETs target once within timeout. It returns "URL: STATUS[: BODY]" for a 2xx
// answer, and an error saying the same (or why there was no answer) otherwise.
func Check(ctx context.Context, target string, timeout time.Duration) (string, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q: want an http:// or https:// URL with a host", target)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("%s: %w", u.Redacted(), err)
	}
	client := &http.Client{
		Transport:     &http.Transport{Proxy: nil, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return "", fmt.Errorf("%s: no answer within %s", u.Redacted(), timeout)
		}
		return "", fmt.Errorf("%s: %w", u.Redacted(), unwrapURLError(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	line := u.Redacted() + ": " + resp.Status
	if first, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n"); first != "" {
		line += ": " + strings.TrimSpace(first)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", errors.New(line)
	}
	return line, nil
}

// unwrapURLError drops *url.Error's "Get \"URL\": " prefix, which the caller already says.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
