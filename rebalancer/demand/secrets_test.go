package demand_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/rebalancer/demand"
	"github.com/quotaplane/quotaplane/rebalancer/demand/demandtest"
	"github.com/quotaplane/quotaplane/regions"
)

const secret = "s3cret-pw"

func noSecret(t *testing.T, what string, s string) {
	t.Helper()
	if strings.Contains(s, secret) {
		t.Errorf("%s shows the password: %s", what, s)
	}
}

// TestURLPasswordNeverShown: a Prometheus URL with user:password@ is used as given, but
// no error (nor a Source printed with %v) shows the password.
func TestURLPasswordNeverShown(t *testing.T) {
	t.Parallel()
	for name, in := range map[string][]string{
		"bad port":          {"http://user:" + secret + "@127.0.0.1:bad"},
		"no scheme":         {"user:" + secret + "@127.0.0.1:9090"},
		"region, bad port":  {"us-east=http://user:" + secret + "@127.0.0.1:bad"},
		"region twice":      {"us-east=http://user:" + secret + "@a", "us-east=http://user:" + secret + "@b"},
		"mixed":             {"http://user:" + secret + "@a", "us-east=http://user:" + secret + "@b"},
		"two plain":         {"http://user:" + secret + "@a", "http://user:" + secret + "@b"},
		"query password":    {"http://127.0.0.1:bad/?password=" + secret},
		"space in the host": {"http://user:" + secret + "@a b"},
	} {
		t.Run("ParseSources "+name, func(t *testing.T) {
			_, err := demand.ParseSources(in)
			if !errors.Is(err, regions.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			noSecret(t, "ParseSources error", err.Error())
		})
	}
	t.Run("New", func(t *testing.T) {
		_, err := demand.New(demand.Config{Sources: []demand.Source{{URL: "http://user:" + secret + "@127.0.0.1:bad"}}})
		if !errors.Is(err, regions.ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
		noSecret(t, "New error", err.Error())
	})
	t.Run("Source", func(t *testing.T) {
		s := demand.Source{Region: "us-east", URL: "http://user:" + secret + "@127.0.0.1:9090"}
		noSecret(t, "a Source printed with %v", fmt.Sprintf("%v %+v %s", s, s, s))
	})
}

// TestReadWithCredentials reads through a user:password@ URL (Prometheus ignores the
// basic auth it did not ask for); once Prometheus is down the error wraps the HTTP
// client's error (errors.As finds the *url.Error) and shows no password.
func TestReadWithCredentials(t *testing.T) {
	t.Parallel()
	exp := demandtest.New()
	t.Cleanup(exp.Close)
	exp.SetRegion("us-east", 10, 0, 0)
	prom := startProm(t, exp)
	u, err := url.Parse(prom.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("user", secret)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	deadURL := fmt.Sprintf("http://user:%s@127.0.0.1:%d", secret, port)

	r := newReader(t, demand.Source{URL: u.String()})
	readUntil(t, r, 30*time.Second, func(d demand.Demand) bool { return len(d.Scopes[regions.GlobalScope]) == 1 })

	dead := newReader(t, demand.Source{URL: deadURL})
	_, err = dead.Read(context.Background(), time.Time{})
	var uerr *url.Error
	if !errors.Is(err, demand.ErrUnavailable) || !errors.As(err, &uerr) {
		t.Fatalf("Read from a closed port: %v, want ErrUnavailable wrapping a *url.Error", err)
	}
	noSecret(t, "Read error", err.Error())

	// Per-region sources: the unreachable region's error is logged by the job.
	perRegion := newReader(t, demand.Source{Region: "us-east", URL: u.String()}, demand.Source{Region: "eu-west", URL: deadURL})
	d, err := perRegion.Read(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if e := d.Unreachable["eu-west"]; e == nil {
		t.Fatal("eu-west not unreachable")
	} else {
		noSecret(t, "Unreachable error", e.Error())
	}
}

// TestAPIErrorsHideTheURLsSecrets: the HTTP client's errors quote the request URL, query
// string included; through Source.API a token parameter or a user-alone token is hidden,
// and the error still says what failed (a refused connection) and is still a deadline
// when it was one.
func TestAPIErrorsHideTheURLsSecrets(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"http://127.0.0.1:1/?token=" + secret,
		"http://" + secret + "@127.0.0.1:1",
		"http://u:" + secret + "@127.0.0.1:1",
	} {
		api, err := demand.Source{URL: u}.API(nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _, _, err = api.Query(ctx, "up", time.Now())
		cancel()
		if err == nil {
			t.Fatalf("%s: query of a closed port answered", u)
		}
		noSecret(t, "query error", err.Error())
		if !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s: error %q does not say what failed", u, err)
		}
	}
	api, err := demand.Source{URL: "http://127.0.0.1:1/?token=" + secret}.API(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, _, err := api.Query(ctx, "up", time.Now()); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled query: %v, want context.Canceled through the scrubbed error", err)
	}
}
