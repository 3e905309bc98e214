package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/testenv"
	"github.com/quotaplane/quotaplane/migrations"
)

// TestBinaryExitCodes builds the real binary and checks what a shell script sees: exit
// codes, one error line on stderr, nothing else.
func TestBinaryExitCodes(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "ratectl")
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(gobin, "build", "-ldflags", "-X github.com/quotaplane/quotaplane/internal/version.version=v9.9.9-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	dbURL := testenv.PostgresDB(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	const password = "n0t-In-0utput"
	deadDB := "postgres://ops:" + password + "@127.0.0.1:" + closedPort + "/x"

	for _, tc := range []struct {
		name   string
		env    []string
		args   []string
		code   int
		stdout string // a substring of stdout
		stderr string // a substring of stderr; "" means stderr must be empty
	}{
		{"version", nil, []string{"version"}, 0, "ratectl v9.9.9-test", ""},
		{"--version", nil, []string{"--version"}, 0, "ratectl v9.9.9-test (commit ", ""},
		{"help", nil, nil, 0, "Usage:", ""},
		{"migrate", []string{envDatabaseURL + "=" + dbURL}, []string{"migrate", "up"}, 0, "applied " + strconv.FormatInt(migrations.Latest(), 10) + " migration(s)", ""},
		{"read", []string{envDatabaseURL + "=" + dbURL}, []string{"rules", "list", "-o", "json"}, 0, `"tenant": "*"`, ""},
		{"operation failed", []string{envDatabaseURL + "=" + dbURL}, []string{"keys", "revoke", "999"}, 1, "", "ratectl: key 999 does not exist"},
		{"usage: unknown command", nil, []string{"frobnicate"}, 2, "", `ratectl: unknown command "frobnicate"`},
		{"usage: bad shares", []string{envDatabaseURL + "=" + dbURL}, []string{"shares", "set", "a=2", "--reason", "x"}, 2, "", "ratectl: share \"a=2\": share 2 is more than 1"},
		{"usage: no database", nil, []string{"regions", "list"}, 2, "", "ratectl: no database"},
		// A flag's bad value in words, not Go's parser ("strconv.ParseInt: parsing ...").
		{"usage: fractional capacity", nil, []string{"rules", "set", "--tenant", "a", "--route", "b", "--capacity", "1.5", "--refill", "1"}, 2, "", `ratectl: --capacity "1.5": want a whole number`},
		{"usage: capacity out of range", nil, []string{"rules", "set", "--tenant", "a", "--route", "b", "--capacity", "99999999999999999999", "--refill", "1"}, 2, "", `ratectl: --capacity "99999999999999999999": out of range`},
		{"database unreachable", []string{envDatabaseURL + "=" + deadDB}, []string{"regions", "list"}, 3, "", "ratectl: database at 127.0.0.1:" + closedPort + " unreachable"},
		{"prometheus unreachable", nil, []string{"status", "--prometheus-url", "http://127.0.0.1:" + closedPort}, 3, "", "ratectl: prometheus at 127.0.0.1:" + closedPort + " unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, tc.env...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q lacks %q", out.String(), tc.stdout)
			}
			switch {
			case tc.stderr == "" && errb.Len() > 0:
				t.Errorf("stderr not empty: %q", errb.String())
			case tc.stderr != "" && (!strings.Contains(errb.String(), tc.stderr) || strings.Count(errb.String(), "\n") != 1):
				t.Errorf("stderr %q: want one line containing %q", errb.String(), tc.stderr)
			}
			if strings.Contains(out.String()+errb.String(), password) {
				t.Errorf("the password is in the output")
			}
		})
	}
}
